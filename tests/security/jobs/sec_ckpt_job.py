"""A root job of the security suite (run under mpiexec): checkpoints and snapshots in planted directories.

``python sec_ckpt_job.py CASES.json OUT``: CASES is a list of ``[label, case, directory, options]``;
every rank runs every case in order and appends one JSON line per case to ``OUT.<rank>``: the label,
the rank,
its result, the error it ended with (``[class, message]`` or null), the CheckpointWarnings it
warned and its peak resident memory.  A case that ends with an error on every rank (the
library raises them together) does not stop the job.
"""

import json
import os
import resource
import sys
import tempfile
import warnings

import chainer
import chainer.links as L
import numpy
from chainer.training import extensions as chainer_extensions

import chainermn_comm
import chainermn_train
from chainermn_train.extensions import CheckpointWarning, multi_node_snapshot

comm = chainermn_comm.create_communicator('naive')


class Net(chainer.Chain):
    """One Linear(3, 2) as ``l1``: snapshot keys ``l1/W`` and ``l1/b``."""

    def __init__(self):
        super().__init__()
        with self.init_scope():
            self.l1 = L.Linear(3, 2)

    def forward(self, x):
        return self.l1(x)


def _net(value):
    net = Net()
    for p in net.params():
        p.array[...] = value
    return net


def _ckpt(d, o, name='run'):
    return chainermn_train.create_multi_node_checkpointer(
        name, comm, path=d, allow_shared=o.get('allow_shared'), cp_interval=o.get('cp_interval', 5),
        gc_interval=o.get('gc_interval', 5))


def save_then_load(d, o):
    """Save generations ``o['save']`` (weights iteration + rank), then load with a fresh checkpointer."""
    cp = _ckpt(d, o)
    net = _net(0.0)
    for it in o.get('save', []):
        for p in net.params():
            p.array[...] = it + comm.rank
        cp.save(net, iteration=it)
    comm.mpi_comm.Barrier()
    fresh = _net(-1.0)
    loaded = _ckpt(d, o).maybe_load(fresh)
    return {'loaded': loaded, 'w': float(fresh.l1.W.array[0, 0]),
            'files': sorted(os.listdir(d)), 'run': cp.run_id}


def _trainer(out, optimizer, seed=0):
    numpy.random.seed(seed)
    net = _net(0.5)
    model = L.Classifier(net, lossfun=chainer.functions.mean_squared_error)
    model.compute_accuracy = False
    x = numpy.random.rand(8, 3).astype(numpy.float32)
    y = numpy.random.rand(8, 2).astype(numpy.float32)
    opt = chainermn_train.create_multi_node_optimizer(optimizer, comm)
    opt.setup(model)
    it = chainer.iterators.SerialIterator(list(zip(x, y)), 2, shuffle=False)
    updater = chainer.training.StandardUpdater(it, opt)
    return chainer.training.Trainer(updater, (2, 'iteration'), out=out), net


def optimizer_swap(d, o):
    """Save an Adam trainer; resume it under MomentumSGD (refused), then load its weights only."""
    d = comm.bcast_obj(tempfile.mkdtemp(prefix='swap-', dir=d) if comm.rank == 0 else None)
    adam, adam_net = _trainer(d, chainer.optimizers.Adam())
    adam.run()
    _ckpt(d, o).save(adam)
    comm.mpi_comm.Barrier()
    sgd, sgd_net = _trainer(d, chainer.optimizers.MomentumSGD(), seed=1)
    before = sgd_net.l1.W.array.copy()
    cp = _ckpt(d, o)
    refused = None
    try:
        cp.maybe_load(sgd)
    except Exception as e:
        refused = [type(e).__name__, str(e)]
    unchanged = bool(numpy.array_equal(before, sgd_net.l1.W.array)) and sgd.updater.iteration == 0
    loaded = cp.maybe_load(sgd, weights_only=True)
    rule = sgd_net.l1.W.update_rule
    return {'refused': refused, 'unchanged_after_refusal': unchanged, 'weights_only': loaded,
            'weights_equal': bool(numpy.array_equal(adam_net.l1.W.array, sgd_net.l1.W.array)),
            'iteration': sgd.updater.iteration, 'momentum_state': rule.state is not None}


def snapshot_load(d, o):
    """Resume a trainer from ``d`` with multi_node_snapshot(snapshot(autoload=True)); one iteration."""
    if o.get('trust'):
        os.environ['CHAINERMN_TRUST_SHARED'] = '1'
    try:
        trainer, net = _trainer(d, chainer.optimizers.SGD())
        trainer.stop_trigger = chainer.training.triggers.IntervalTrigger(1, 'iteration')
        snap = chainer_extensions.snapshot(autoload=True, filename='snapshot_iter_{.updater.iteration}')
        trainer.extend(multi_node_snapshot(comm, snap, [0]), trigger=(1, 'iteration'))
        trainer.run()
        return {'iteration': trainer.updater.iteration, 'w': float(net.l1.W.array[0, 0])}
    finally:
        os.environ.pop('CHAINERMN_TRUST_SHARED', None)


CASES = {f.__name__: f for f in (save_then_load, optimizer_swap, snapshot_load)}


def main():
    with open(sys.argv[1]) as f:
        cases = json.load(f)
    for label, case, d, options in cases:
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter('always')
            result, error = None, None
            try:
                result = CASES[case](d, options)
            except Exception as e:
                error = [type(e).__name__, str(e)]
        comm.mpi_comm.Barrier()
        with open('{}.{}'.format(sys.argv[2], comm.rank), 'a') as f:
            f.write(json.dumps({
                'case': label, 'rank': comm.rank, 'result': result, 'error': error,
                'warnings': [str(x.message) for x in w if issubclass(x.category, CheckpointWarning)],
                'maxrss_kib': resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}) + '\n')


if __name__ == '__main__':
    main()
