"""Elastic test job: train an MLP with the checkpointer, resume on any number of ranks.

Usage: resize_job.py OUT STOP ITERATOR
  STOP      ``40i`` (iterations) or ``1e`` (epochs)
  ITERATOR  ``serial`` (scatter_dataset with shuffle + SerialIterator), ``elastic`` or ``multinode``
            (rank 0's SerialIterator over the whole dataset serves every rank)
Environment: KILL_AT / KILL_RANK (SIGKILL itself at that iteration), RUN (tag of the log lines),
JOB_HIDDEN (hidden units, default 8), SHARD_STATE (1: ``shard_state=True``), DOWN_MARK (a file
created before the kill; the launcher's stand-in for ssh then refuses that host).  The kill happens in run 1 only (RUN, default: one more
than $CHAINERMN_LAUNCH_RESTARTS).
Writes OUT/resume.<rank>.json and OUT/resumed.<rank>.npz right after ``maybe_load``, one line per
iteration to OUT/samples.<rank>.log (run, iteration, positions, sample ids) and OUT/final.<rank>.npz.
"""

import json
import os
import signal
import sys

import chainer
import chainer.functions as F
import chainer.links as L
import numpy

import chainermn

N, BATCH = 240, 4


class MLP(chainer.Chain):
    def __init__(self):
        super().__init__()
        with self.init_scope():
            hidden = int(os.environ.get('JOB_HIDDEN', '8'))
            self.l1 = L.Linear(4, hidden)
            self.l2 = L.Linear(hidden, 3)

    def forward(self, x):
        return self.l2(F.relu(self.l1(x)))


def params(model):
    return {k.replace('/', '_'): p.array for k, p in model.namedparams()}


def main(out, stop, kind):
    comm = chainermn.create_communicator('naive')
    run = os.environ.get('RUN', str(1 + int(os.environ.get('CHAINERMN_LAUNCH_RESTARTS', '0'))))
    kill_at = int(os.environ.get('KILL_AT', '0'))
    kill_rank = int(os.environ.get('KILL_RANK', '0'))
    rs = numpy.random.RandomState(0)
    x = rs.standard_normal((N, 4)).astype(numpy.float32)
    y = (x[:, 0] > 0).astype(numpy.int32) + (x[:, 1] > 0).astype(numpy.int32)
    ids = numpy.arange(N, dtype=numpy.int32)
    full = chainer.datasets.TupleDataset(x, y, ids)
    if kind == 'elastic':
        it = chainermn.iterators.create_elastic_iterator(full, BATCH, comm, seed=3)
    elif kind == 'multinode':
        master = chainer.iterators.SerialIterator(full, BATCH, shuffle=True) if comm.rank == 0 else None
        it = chainermn.iterators.create_multi_node_iterator(master, comm)
    else:
        shard = chainermn.scatter_dataset(full if comm.rank == 0 else None, comm, shuffle=True, seed=0)
        it = chainer.iterators.SerialIterator(shard, BATCH, shuffle=True)
    numpy.random.seed(1)   # the same initial weights on every rank
    model = L.Classifier(MLP())
    opt = chainermn.create_multi_node_optimizer(chainer.optimizers.Adam(alpha=0.01), comm,
                                                shard_state=os.environ.get('SHARD_STATE') == '1')
    opt.setup(model)
    log = open(os.path.join(out, 'samples.{}.log'.format(comm.rank)), 'a')

    def loss_func(xb, yb, idb):
        positions = getattr(it, 'last_positions', [])
        log.write('{} {} {} {}\n'.format(run, updater.iteration + 1,
                                         ','.join(str(int(p)) for p in positions),
                                         ','.join(str(int(i)) for i in idb)))
        log.flush()
        return model(xb, yb)

    updater = chainer.training.StandardUpdater(it, opt, loss_func=loss_func)
    length = (int(stop[:-1]), {'i': 'iteration', 'e': 'epoch'}[stop[-1]])
    trainer = chainer.training.Trainer(updater, length, out=out)
    cp = chainermn.create_multi_node_checkpointer('job', comm, path=os.path.join(out, 'cp'))
    trainer.extend(cp, trigger=(5, 'iteration'))

    @chainer.training.make_extension(trigger=(1, 'iteration'), priority=0)
    def killer(t):
        if kill_at and t.updater.iteration == kill_at and run == '1':
            cp.settle()   # every rank: the background writes so far are durable and recorded complete
        if kill_at and comm.rank == kill_rank and t.updater.iteration == kill_at and run == '1':
            if os.environ.get('DOWN_MARK'):
                open(os.environ['DOWN_MARK'], 'w').close()   # this rank's host goes away for good
            os.kill(os.getpid(), signal.SIGKILL)

    trainer.extend(killer)
    if comm.rank == 0:   # state that only rank 0 holds
        trainer.extend(chainer.training.extensions.LogReport(trigger=(5, 'iteration')))
    loaded = cp.maybe_load(trainer, opt)
    with open(os.path.join(out, 'resume.{}.json'.format(comm.rank)), 'w') as f:
        json.dump({'loaded': loaded, 'iteration': updater.iteration, 'epoch': it.epoch,
                   'epoch_detail': it.epoch_detail, 'length': len(getattr(it, 'dataset', full)),
                   'batch': BATCH, 'size': comm.size, 'mode': cp.get_stats().get('load_mode')}, f)
    numpy.savez(os.path.join(out, 'resumed.{}.npz'.format(comm.rank)), **params(model))
    print('rank {} resumed-from {}'.format(comm.rank, loaded), flush=True)
    trainer.run()
    numpy.savez(os.path.join(out, 'final.{}.npz'.format(comm.rank)), **params(model))
    print('rank {} done at iteration {}'.format(comm.rank, updater.iteration), flush=True)


if __name__ == '__main__':
    main(*sys.argv[1:4])
