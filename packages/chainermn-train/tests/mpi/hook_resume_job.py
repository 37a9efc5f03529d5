"""Job for test_hooks_checkpoint_mpi.py: train with PowerSGD and the checkpointer, resume, report.

Usage: hook_resume_job.py OUT STOP   (STOP: the last iteration)
Environment: KILL_AT (rank 1 SIGKILLs itself after that iteration).  Writes OUT/loaded.<rank>.npz
right after ``maybe_load`` (the hook's state as loaded) and OUT/final.<rank>.npz at the end
(parameters and the hook's state).
"""

import os
import signal
import sys

import chainer
import chainer.functions as F
import chainer.links as L
import numpy

import chainermn

N, BATCH = 96, 4


class Net(chainer.Chain):
    def __init__(self):
        super().__init__()
        with self.init_scope():
            self.l1 = L.Linear(8, 16)
            self.l2 = L.Linear(16, 3)

    def forward(self, x):
        return self.l2(F.relu(self.l1(x)))


def hook_state(opt):
    ser = chainer.serializers.DictionarySerializer()
    opt.comm_hook.serialize(ser)
    return {'hook/' + k: numpy.asarray(v) for k, v in ser.target.items()}


def main(out, stop):
    comm = chainermn.create_communicator('naive')
    kill_at = int(os.environ.get('KILL_AT', '0'))
    rs = numpy.random.RandomState(0)
    x = rs.standard_normal((N, 8)).astype(numpy.float32)
    y = (x[:, 0] > 0).astype(numpy.int32) + (x[:, 1] > 0).astype(numpy.int32)
    data = chainer.datasets.TupleDataset(x, y)
    shard = chainermn.scatter_dataset(data if comm.rank == 0 else None, comm, shuffle=True, seed=0)
    numpy.random.seed(1)
    it = chainer.iterators.SerialIterator(shard, BATCH, shuffle=True)
    model = L.Classifier(Net())
    hook = chainermn.hooks.PowerSGD(rank=2, start_update=2)
    opt = chainermn.create_multi_node_optimizer(chainer.optimizers.MomentumSGD(lr=0.1), comm,
                                                comm_hook=hook)
    opt.setup(model)
    updater = chainer.training.StandardUpdater(it, opt)
    trainer = chainer.training.Trainer(updater, (int(stop), 'iteration'), out=out)
    # Synchronous: the test reads the snapshot of iteration 8 after a kill at 10 (a background
    # write of it may still be in flight then; background saves: test_background_checkpoint_mpi).
    cp = chainermn.create_multi_node_checkpointer('job', comm, path=os.path.join(out, 'cp'),
                                                  background=False)
    trainer.extend(cp, trigger=(4, 'iteration'))

    @chainer.training.make_extension(trigger=(1, 'iteration'), priority=0)
    def killer(t):
        if kill_at and comm.rank == 1 and t.updater.iteration == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

    trainer.extend(killer)
    loaded = cp.maybe_load(trainer, opt)
    state = hook_state(opt)
    state['loaded'] = numpy.array(-1 if loaded is None else loaded)
    numpy.savez(os.path.join(out, 'loaded.{}.npz'.format(comm.rank)), **state)
    trainer.run()
    final = hook_state(opt)
    final.update({'param' + k.replace('/', '_'): p.array for k, p in model.namedparams()})
    numpy.savez(os.path.join(out, 'final.{}.npz'.format(comm.rank)), **final)
    print('rank {} done at iteration {}'.format(comm.rank, updater.iteration), flush=True)


if __name__ == '__main__':
    main(*sys.argv[1:3])
