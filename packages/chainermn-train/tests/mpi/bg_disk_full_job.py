"""A job whose checkpoint disk (a small tmpfs, mounted by the test) fills up for one save.

Run by test_background_checkpoint_mpi.py under ``unshare -m`` at 2 ranks: ``bg_disk_full_job.py
DIR`` saves 5 (complete), fills DIR up, saves 10 (every rank's write meets ENOSPC in the
background), polls as the extension does until the ranks agreed, frees the disk, saves 15, and
checks: the failure is reported once (rank 0), counted, 5 stays, training (the loop) goes on, 15
is complete and loads, and the end says 1 save failed.
"""

import errno
import os
import sys
import warnings

import chainer
import numpy

import chainermn_comm
from chainermn_train import create_multi_node_checkpointer


class Model(chainer.Link):
    def __init__(self):
        super().__init__()
        with self.init_scope():
            self.W = chainer.Parameter(numpy.zeros((256, 256), numpy.float32))


def _fill(path):
    """Write a file until the file system is full; return its name."""
    filler = os.path.join(path, 'filler')
    chunk = b'\0' * (64 << 10)
    with open(filler, 'wb', buffering=0) as f:   # unbuffered: nothing left to flush (and fail) at close
        try:
            while True:
                f.write(chunk)
        except OSError as e:
            assert e.errno == errno.ENOSPC, e
    return filler


def _polled(cp, model):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        while not cp.poll():   # each poll stands for a training iteration
            model.W.array[...] += 1
    return [str(w.message) for w in caught]


def main():
    comm = chainermn_comm.create_communicator('naive')
    path = sys.argv[1]
    cp = create_multi_node_checkpointer('full', comm, path=path, cp_interval=1, gc_interval=1)
    assert cp.background
    model = Model()
    model.W.array[...] = 5
    cp.save(model, iteration=5)
    assert _polled(cp, model) == [] and cp.local_iterations() == [5]
    comm.allreduce_obj(0)
    filler = _fill(path) if comm.rank == 0 else None
    comm.allreduce_obj(0)
    model.W.array[...] = 10
    cp.save(model, iteration=10)   # returns; the write fails in the background
    said = _polled(cp, model)
    if comm.rank == 0:
        assert len(said) == 1, said
        assert 'iteration 10 failed on rank(s) 0 (OSError: [Errno 28] No space left on device' in said[0], said
        assert 'newest complete generation (iteration 5) stays' in said[0], said
    else:
        assert said == [], said
    assert cp.get_stats()['failed_saves'] == 1
    assert cp.local_iterations() == [5], cp.local_iterations()
    assert not [n for n in os.listdir(path) if n.endswith('.tmp')], os.listdir(path)
    comm.allreduce_obj(0)
    if comm.rank == 0:
        os.unlink(filler)
    comm.allreduce_obj(0)
    model.W.array[...] = 15
    cp.save(model, iteration=15)   # the next save tries again
    assert _polled(cp, model) == []
    assert cp.get_stats()['failed_saves'] == 1
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        cp._completed = lambda: False   # an interrupted run: its files stay
        cp.finalize()
    said = [str(w.message) for w in caught]
    assert ['1 save(s) of the job failed' in s for s in said] == ([True] if comm.rank == 0 else []), said
    fresh = Model()
    got = create_multi_node_checkpointer('full', comm, path=path).maybe_load(fresh)
    assert got == 15 and (fresh.W.array == 15).all(), got
    print('FULL OK rank', comm.rank, flush=True)


if __name__ == '__main__':
    main()
