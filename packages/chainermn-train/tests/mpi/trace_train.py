"""Trace test script: a tiny training loop with an evaluator, a checkpointer and a snapshot.

Usage: trace_train.py OUT ITERS [--slow-rank R --sleep S] [--overlap | --double] [--powersgd]
                                [--raise-at N] [--sigterm-at N [--no-preemption]] [--device-timed]

``--slow-rank``: that rank sleeps ``S`` seconds in its converter (a slow data path).
``--raise-at``: rank 1 (rank 0 with one rank) raises at that iteration, under the global
except hook.  ``--sigterm-at``: rank 0 sends itself SIGTERM at that iteration, under the
preemption handler (``--no-preemption``: without it).  Prints ``rank R done`` at a normal end.
"""

import argparse
import os
import signal
import sys
import time

import chainer
import chainer.functions as F
from chainer.training import extensions

sys.path.insert(0, os.path.dirname(__file__))
import _common  # noqa: E402

import chainermn_comm  # noqa: E402
import chainermn_train  # noqa: E402
from chainermn_train import preemption  # noqa: E402


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument('out')
    p.add_argument('iters', type=int)
    p.add_argument('--slow-rank', type=int, default=-1)
    p.add_argument('--sleep', type=float, default=0.0)
    p.add_argument('--all-sleep', type=float, default=0.0,
                   help='every rank sleeps this long in its converter (a balanced, slower data path)')
    p.add_argument('--overlap', action='store_true')
    p.add_argument('--double', action='store_true')
    p.add_argument('--powersgd', action='store_true', help='average with comm_hook=PowerSGD(rank=1)')
    p.add_argument('--raise-at', type=int, default=0)
    p.add_argument('--sigterm-at', type=int, default=0)
    p.add_argument('--no-preemption', action='store_true', help='SIGTERM without the handler')
    p.add_argument('--device-timed', action='store_true',
                   help='time the phases as if the model were on a GPU (with tests/fakecupy)')
    args = p.parse_args(argv)
    if args.double:
        import mpi4py
        mpi4py.rc.thread_level = 'multiple'
    chainermn_comm.global_except_hook.add_hook()
    if args.device_timed:  # CUDA events of the stand-in time the phases (host arrays otherwise)
        from chainermn_train import _optimizer
        _optimizer._on_device = lambda link: True
    comm = _common.comm()
    model = _common.make_model(11)
    x, y = _common.data(48, seed=3)
    train = list(zip(x[comm.rank::comm.size], y[comm.rank::comm.size]))
    test = train[:6]
    it = chainer.iterators.SerialIterator(train, 4, shuffle=False)
    opt = chainermn_train.create_multi_node_optimizer(
        chainer.optimizers.Adam(alpha=0.01), comm, overlap=args.overlap, double_buffering=args.double,
        comm_hook=chainermn_comm.hooks.PowerSGD(rank=1, start_update=0) if args.powersgd else None)
    opt.setup(model)

    def convert(batch, device=None):
        if comm.rank == args.slow_rank:
            time.sleep(args.sleep)  # this rank's data path is slow
        if args.all_sleep:
            time.sleep(args.all_sleep)  # iterations long enough that scheduling jitter is no straggler
        return chainer.dataset.concat_examples(batch, device)

    def loss(xb, yb):
        return F.mean_squared_error(model(xb), yb)

    updater = chainer.training.StandardUpdater(it, opt, converter=convert, loss_func=loss)
    trainer = chainer.training.Trainer(updater, (args.iters, 'iteration'), out=args.out)
    scored = chainer.links.Classifier(model, lossfun=F.mean_squared_error)
    scored.compute_accuracy = False
    evaluator = extensions.Evaluator(chainer.iterators.SerialIterator(test, 3, repeat=False), scored,
                                     converter=convert)
    trainer.extend(chainermn_train.create_multi_node_evaluator(evaluator, comm),
                   trigger=(5, 'iteration'))
    cp = chainermn_train.create_multi_node_checkpointer('trace', comm, path=os.path.join(args.out, 'cp'))
    trainer.extend(cp, trigger=(4, 'iteration'))
    snap = extensions.snapshot(filename='snap_{.updater.iteration}')
    trainer.extend(chainermn_train.extensions.multi_node_snapshot(comm, snap, [0]),
                   trigger=(6, 'iteration'))
    if args.sigterm_at and not args.no_preemption:
        preemption.install(trainer, cp, comm)
    failing = 1 if comm.size > 1 else 0

    @chainer.training.make_extension(trigger=(1, 'iteration'), priority=0)
    def fault(t):
        n = t.updater.iteration
        if args.raise_at and n == args.raise_at and comm.rank == failing:
            raise RuntimeError('planned failure at iteration {}'.format(n))
        if args.sigterm_at and n == args.sigterm_at and comm.rank == 0:
            os.kill(os.getpid(), signal.SIGTERM)

    trainer.extend(fault)
    cp.maybe_load(trainer, opt)
    trainer.run()
    print('rank {} done'.format(comm.rank), flush=True)


if __name__ == '__main__':
    main()
