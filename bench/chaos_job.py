"""The job of the chaos run (``bench/chaos_run.py``): small deterministic training that checkpoints.

usage: chaos_job.py CTL ITERATIONS [--ckpt DIR] [--cp-every C] [--pace S] [--tag TAG] [--seed N]

Every rank trains the same MLP (Adam, ``create_multi_node_optimizer``) on its own fixed shard of a
synthetic data set (no shuffling: the data a step sees depends only on the iteration), saves a
generation every C iterations with ``create_multi_node_checkpointer(..., background=True)`` into
DIR and resumes from the newest complete one with ``maybe_load``.  ``--pace S`` sleeps S seconds
after every update (all ranks at the same point: it stretches the run without changing a bit).

Talks with the chaos driver through the directory CTL (on the host's file system, which every
node sees):
- rank 0 writes ``CTL/progress.TAG`` (``iteration unix_time``) after every iteration;
- a file ``CTL/kill_at`` holding ``POINT@RANK`` (a kill point of the checkpointer's background
  save, ``chainermn_train.checkpoint.write.background.KILL_POINTS``) is taken by that rank, which then
  SIGKILLs itself when its next save reaches POINT (the checkpointer's own test hook);
- each rank writes ``CTL/final.TAG.RANK.npz``: its parameters and optimizer state at the end.
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

import chainermn
from chainermn_train.checkpoint.write import background as _background   # the kill-point test hook (KILL_POINTS)


class MLP(chainer.Chain):
    def __init__(self, n_in, n_hidden, n_out):
        super().__init__()
        with self.init_scope():
            self.l1 = L.Linear(n_in, n_hidden)
            self.l2 = L.Linear(n_hidden, n_hidden)
            self.l3 = L.Linear(n_hidden, n_out)

    def forward(self, x):
        return self.l3(F.relu(self.l2(F.relu(self.l1(x)))))


def make_dataset(seed, n=4096, n_in=32, n_out=10):
    rng = numpy.random.RandomState(seed)
    x = rng.randn(n, n_in).astype(numpy.float32)
    w = rng.randn(n_in, n_out).astype(numpy.float32)
    t = (x @ w + 0.5 * rng.randn(n, n_out)).argmax(axis=1).astype(numpy.int32)
    return chainer.datasets.TupleDataset(x, t)


def _write(path, text):
    tmp = '{}.{}.tmp'.format(path, os.getpid())
    with open(tmp, 'w') as f:
        f.write(text)
    os.replace(tmp, path)


class Chaos(training.Extension):
    """Pace the run, report progress (rank 0) and take a kill point meant for this rank."""

    trigger = (1, 'iteration')
    priority = training.extension.PRIORITY_WRITER

    def __init__(self, ctl, tag, rank, pace):
        self.ctl, self.tag, self.rank, self.pace = ctl, tag, rank, pace
        self.kill_file = os.path.join(ctl, 'kill_at')

    def __call__(self, trainer):
        if self.rank == 0:
            _write(os.path.join(self.ctl, 'progress.' + self.tag),
                   '{} {:.3f}\n'.format(trainer.updater.iteration, time.time()))
        if os.path.exists(self.kill_file):
            try:
                with open(self.kill_file) as f:
                    want = f.read().strip()
            except OSError:
                want = ''
            point, _, who = want.partition('@')
            if who.isdigit() and int(who) == self.rank and point in _background.KILL_POINTS:
                try:
                    os.remove(self.kill_file)   # taken: a restart does not kill itself again
                except OSError:
                    return
                sys.stderr.write('CHAOS-ARMED rank={} point={} iteration={}\n'.format(
                    self.rank, point, trainer.updater.iteration))
                sys.stderr.flush()
                _background.kill_at = want
        if self.pace > 0:
            time.sleep(self.pace)


def main():
    p = argparse.ArgumentParser()
    p.add_argument('ctl')
    p.add_argument('iterations', type=int)
    p.add_argument('--ckpt', default=None, help='checkpoint directory (default CTL/ckpt)')
    p.add_argument('--cp-every', type=int, default=20)
    p.add_argument('--pace', type=float, default=0.0)
    p.add_argument('--tag', default='run')
    p.add_argument('--seed', type=int, default=0)
    p.add_argument('--hidden', type=int, default=128)
    p.add_argument('--batch', type=int, default=32)
    args = p.parse_args()

    comm = chainermn.create_communicator()
    numpy.random.seed(args.seed)
    model = L.Classifier(MLP(32, args.hidden, 10))
    optimizer = chainermn.create_multi_node_optimizer(chainer.optimizers.Adam(alpha=1e-3), comm)
    optimizer.setup(model)

    dataset = make_dataset(args.seed)
    mine = dataset[comm.rank::comm.size]
    it = chainer.iterators.SerialIterator(mine, args.batch, repeat=True, shuffle=False)
    updater = training.updaters.StandardUpdater(it, optimizer)
    trainer = training.Trainer(updater, (args.iterations, 'iteration'), out=args.ctl)

    ckpt_dir = args.ckpt or os.path.join(args.ctl, 'ckpt')
    checkpointer = chainermn.create_multi_node_checkpointer(
        'chaos', comm, cp_interval=3, gc_interval=3, path=ckpt_dir, background=True)
    trainer.extend(checkpointer, trigger=(args.cp_every, 'iteration'))
    trainer.extend(Chaos(args.ctl, args.tag, comm.rank, args.pace))

    loaded = checkpointer.maybe_load(trainer, optimizer)
    sys.stderr.write('CHAOS-RESUMED rank={} iteration={} loaded={}\n'.format(
        comm.rank, updater.iteration, loaded))
    sys.stderr.flush()
    trainer.run()

    arrays = {}
    for name, param in sorted(model.namedparams()):
        arrays['param' + name] = param.array
        for key, value in sorted(param.update_rule.state.items()):
            arrays['state' + name + '/' + key] = value
    numpy.savez(os.path.join(args.ctl, 'final.{}.{}.npz'.format(args.tag, comm.rank)), **arrays)
    stats = checkpointer.get_stats()
    sys.stderr.write('CHAOS-DONE rank={} iteration={} failed_saves={} saves={}\n'.format(
        comm.rank, updater.iteration, stats['failed_saves'], stats['saves']))
    sys.stderr.flush()


if __name__ == '__main__':
    main()
