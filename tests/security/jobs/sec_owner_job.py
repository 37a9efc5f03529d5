"""Root jobs of the security suite that share a checkpoint directory (run under mpiexec).

- ``hold DIR FIFO OUT``: claim DIR for snapshots 'run', save generation 1, print READY (rank 0),
  wait until the test closes FIFO, save generation 2, load it with a fresh checkpointer and
  check that every rank holds the same weights.
- ``start DIR OUT``: a second job on DIR; it must be refused at start.  Were it not, it would
  save generation 3 with weights that differ per rank.
- ``claim OUT DIR...``: create a checkpointer on each DIR in turn (records planted by the test).

Each rank appends JSON lines to ``OUT.<rank>``.
"""

import json
import sys
import warnings

import chainer
import chainer.links as L

import chainermn_comm
import chainermn_train
from chainermn_train.extensions import CheckpointWarning

comm = chainermn_comm.create_communicator('naive')


def _write(out, **doc):
    with open('{}.{}'.format(out, comm.rank), 'a') as f:
        f.write(json.dumps(dict(doc, rank=comm.rank)) + '\n')


def _net(value):
    net = chainer.Sequential(L.Linear(3, 2))
    for p in net.params():
        p.array[...] = value
    return net


def _try(out, label, make):
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter('always')
        try:
            result, error = make(), None
        except Exception as e:
            result, error = None, [type(e).__name__, str(e)]
    _write(out, case=label, error=error,
           warnings=[str(x.message) for x in w if issubclass(x.category, CheckpointWarning)])
    return result


def hold(d, fifo, out):
    cp = chainermn_train.create_multi_node_checkpointer('run', comm, path=d)
    cp.save(_net(1.0), iteration=1)
    comm.mpi_comm.Barrier()
    if comm.rank == 0:
        print('READY', flush=True)
        with open(fifo) as f:   # blocks until the test has run the second job and closed the FIFO
            f.read()
    comm.mpi_comm.Barrier()
    cp.save(_net(2.0), iteration=2)
    comm.mpi_comm.Barrier()
    fresh = _net(-1.0)
    loaded = chainermn_train.create_multi_node_checkpointer('run', comm, path=d).maybe_load(fresh)
    weights = [float(p.array.sum()) for p in fresh.params()]
    _write(out, case='hold', loaded=loaded, same=comm.allgather_obj(weights) == [weights] * comm.size,
           weights=weights, run=cp.run_id)


def start(d, out):
    cp = _try(out, 'start', lambda: chainermn_train.create_multi_node_checkpointer('run', comm, path=d))
    if cp is not None:
        cp.save(_net(100.0 + comm.rank), iteration=3)


def claim(out, *dirs):
    for d in dirs:
        _try(out, d, lambda: chainermn_train.create_multi_node_checkpointer('run', comm, path=d))


if __name__ == '__main__':
    {'hold': hold, 'start': start, 'claim': claim}[sys.argv[1]](*sys.argv[2:])
