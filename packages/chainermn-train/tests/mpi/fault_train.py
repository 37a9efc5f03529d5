"""Fault-test script: train with the checkpointer; SIGKILL itself at $KILL_AT on rank $KILL_RANK."""

import os
import signal
import sys

import chainer
import chainer.functions as F
import numpy

sys.path.insert(0, os.path.dirname(__file__))
import _common  # noqa: E402

import chainermn_train  # noqa: E402


def main(out, iters):
    comm = _common.comm()
    kill_at = int(os.environ.get('KILL_AT', '0'))
    kill_rank = int(os.environ.get('KILL_RANK', '0'))
    model = _common.make_model(11)
    x, y = _common.data(40, seed=3)
    train = list(zip(x[comm.rank::comm.size], y[comm.rank::comm.size]))
    it = chainer.iterators.SerialIterator(train, 3, shuffle=False)
    opt = chainermn_train.create_multi_node_optimizer(chainer.optimizers.Adam(alpha=0.01), comm)
    opt.setup(model)
    updater = chainer.training.StandardUpdater(
        it, opt, converter=chainer.dataset.concat_examples,
        loss_func=lambda xb, yb: F.mean_squared_error(model(xb), yb))
    trainer = chainer.training.Trainer(updater, (iters, 'iteration'), out=out)
    cp = chainermn_train.create_multi_node_checkpointer('fault', comm, cp_interval=3, gc_interval=2,
                                                        path=os.path.join(out, 'cp'))
    trainer.extend(cp, trigger=(2, 'iteration'))

    @chainer.training.make_extension(trigger=(1, 'iteration'), priority=0)
    def killer(t):
        if kill_at and comm.rank == kill_rank and t.updater.iteration == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

    trainer.extend(killer)
    loaded = cp.maybe_load(trainer, opt)
    print('rank {} resumed-from {}'.format(comm.rank, loaded), flush=True)
    trainer.run()
    numpy.savez(os.path.join(out, 'final.{}.npz'.format(comm.rank)),
                **{k.replace('/', '_'): p.array for k, p in model.namedparams()})
    print('rank {} done files-left {}'.format(comm.rank, cp.local_iterations()), flush=True)


if __name__ == '__main__':
    main(sys.argv[1], int(sys.argv[2]))
