"""Fault job: tiny deterministic data-parallel training with the multi-node checkpointer and preemption.

usage: job_train.py WORKDIR ITERATIONS [--gate K] [--cp-every C]

Resumes from WORKDIR/ckpt with ``checkpointer.maybe_load``, trains to ITERATIONS, and writes the
final parameters (rank 0) to WORKDIR/final.npz.  With ``--gate K`` every rank writes its pid to
WORKDIR/pid.<rank> at iteration K and waits there (at most 60 s) until a stop signal has arrived,
so that a test can send SIGTERM mid-training at a known point.
"""

import argparse
import os
import sys
import time

import chainer
import chainer.functions as F
import chainer.links as L
import numpy
from chainer import training

import chainermn_comm
import chainermn_train
from chainermn_train import preemption


def make_dataset():
    rng = numpy.random.RandomState(0)
    x = rng.randn(96, 4).astype(numpy.float32)
    w = rng.randn(4, 3).astype(numpy.float32)
    t = (x @ w).argmax(axis=1).astype(numpy.int32)
    return chainer.datasets.TupleDataset(x, t)


class DataParallelUpdater(training.updaters.StandardUpdater):
    """StandardUpdater that averages gradients over the ranks before the update."""

    def __init__(self, iterator, optimizer, comm):
        super().__init__(iterator, optimizer)
        self.comm = comm

    def update_core(self):
        batch = self.get_iterator('main').next()
        x, t = self.converter(batch, self.device)
        optimizer = self.get_optimizer('main')
        model = optimizer.target
        loss = F.softmax_cross_entropy(model(x), t)
        model.cleargrads()
        loss.backward()
        self.comm.allreduce_grad(model)
        optimizer.update()


class Gate(training.Extension):
    """Write this rank's pid and wait until the preemption handler saw a signal (test hook)."""

    trigger = (1, 'iteration')
    priority = training.extension.PRIORITY_READER

    def __init__(self, at, workdir, handler, rank):
        self.at, self.workdir, self.handler, self.rank = at, workdir, handler, rank

    def __call__(self, trainer):
        if trainer.updater.iteration != self.at:
            return
        path = os.path.join(self.workdir, 'pid.{}'.format(self.rank))
        with open(path + '.tmp', 'w') as f:
            f.write(str(os.getpid()))
        os.replace(path + '.tmp', path)
        deadline = time.monotonic() + 60
        while self.handler.received is None and time.monotonic() < deadline:
            time.sleep(0.005)


def main():
    p = argparse.ArgumentParser()
    p.add_argument('workdir')
    p.add_argument('iterations', type=int)
    p.add_argument('--gate', type=int, default=None)
    p.add_argument('--gate-ranks', default=None, help='comma-separated ranks that wait (default: all)')
    p.add_argument('--cp-every', type=int, default=5)
    args = p.parse_args()

    comm = chainermn_comm.create_communicator('naive')
    # Same initial weights everywhere: seed the parameters' RNG, then broadcast from rank 0.
    numpy.random.seed(1)
    model = L.Linear(4, 3)
    comm.bcast_data(model)
    optimizer = chainer.optimizers.MomentumSGD(lr=0.1)
    optimizer.setup(model)

    dataset = make_dataset()
    mine = dataset[comm.rank::comm.size]
    it = chainer.iterators.SerialIterator(mine, 8, repeat=True, shuffle=False)
    updater = DataParallelUpdater(it, optimizer, comm)
    trainer = training.Trainer(updater, (args.iterations, 'iteration'), out=args.workdir)

    # Synchronous: the tests read which generations exist right after a kill at the gate
    # (background saves and their kill points: test_background_checkpoint_mpi).
    checkpointer = chainermn_train.create_multi_node_checkpointer(
        'faultrun', comm, cp_interval=20, gc_interval=20, path=os.path.join(args.workdir, 'ckpt'),
        background=False)
    trainer.extend(checkpointer, trigger=(args.cp_every, 'iteration'))
    handler = preemption.install(trainer, checkpointer, comm)
    gated = None if args.gate_ranks is None else {int(r) for r in args.gate_ranks.split(',')}
    if args.gate is not None and (gated is None or comm.rank in gated):
        trainer.extend(Gate(args.gate, args.workdir, handler, comm.rank))

    checkpointer.maybe_load(trainer, optimizer)
    sys.stderr.write('FAULT-RESUMED-AT rank={} iteration={}\n'.format(comm.rank, updater.iteration))
    sys.stderr.flush()
    trainer.run()

    if comm.rank == 0:
        numpy.savez(os.path.join(args.workdir, 'final.npz'),
                    **{name: param.array for name, param in model.namedparams()})
    print('FAULT-TRAIN-DONE rank={} iteration={}'.format(comm.rank, updater.iteration))


if __name__ == '__main__':
    main()
