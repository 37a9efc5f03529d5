"""Job of test_sharded_checkpoint_mpi.py: train with the checkpointer, sharded or not, and resume.

Usage: shard_resume_job.py OUT PLAN
  PLAN  comma-separated runs, each ``TAG:DIR:SHARD:STOP``: train (resuming from the snapshots in
        OUT/DIR, if any) with ``shard_state=SHARD`` (0/1) to iteration STOP, saving every 5
        iterations (the files stay: the run does not reach its stop trigger).
Writes OUT/TAG.<rank>.npz (the final parameters) and OUT/TAG.<rank>.json (what was loaded, the
load mode, t, which rules hold state, or the error) for each run.
"""

import json
import os
import sys
import time
import warnings

import chainer
import chainer.functions as F
import chainer.links as L
import numpy

import chainermn

N, BATCH, SAVE_EVERY = 240, 4, 5


class MLP(chainer.Chain):
    def __init__(self):
        super().__init__()
        with self.init_scope():
            self.l1 = L.Linear(4, 12)
            self.l2 = L.Linear(12, 10)
            self.l3 = L.Linear(10, 3)

    def forward(self, x):
        return self.l3(F.relu(self.l2(F.relu(self.l1(x)))))


def run(comm, out, tag, where, shard, stop):
    rs = numpy.random.RandomState(0)
    x = rs.standard_normal((N, 4)).astype(numpy.float32)
    y = ((x[:, 0] > 0).astype(numpy.int32) + (x[:, 1] > 0).astype(numpy.int32))
    full = chainer.datasets.TupleDataset(x, y)
    part = chainermn.scatter_dataset(full if comm.rank == 0 else None, comm)
    it = chainer.iterators.SerialIterator(part, BATCH, shuffle=False)
    numpy.random.seed(1)
    model = L.Classifier(MLP())
    opt = chainermn.create_multi_node_optimizer(chainer.optimizers.Adam(alpha=0.01), comm,
                                                shard_state=shard)
    opt.setup(model)
    opt.add_hook(chainer.optimizer_hooks.WeightDecay(1e-3))
    updater = chainer.training.StandardUpdater(it, opt)
    trainer = chainer.training.Trainer(updater, (1000, 'iteration'), out=out)
    cp = chainermn.create_multi_node_checkpointer('job', comm, path=os.path.join(out, where))
    report = {'rank': comm.rank, 'size': comm.size}
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter('always')
            report['loaded'] = cp.maybe_load(trainer, opt)
        report['warnings'] = [str(w.message) for w in caught]
        report['mode'] = cp.get_stats().get('load_mode')
        report['loaded_t'] = int(opt.t)
        report['loaded_rule_t'] = {n: int(p.update_rule.t) for n, p in sorted(model.namedparams())}
        report['with_state'] = sorted(n for n, p in model.namedparams() if p.update_rule.state is not None)
        cp.initialize(trainer)
        trainer._start_at = time.perf_counter()   # driven by hand (a Trainer reports its elapsed time)
        while updater.iteration < stop:
            updater.update()
            if updater.iteration % SAVE_EVERY == 0:
                cp(trainer)
        cp.settle()   # agree that the last save is complete (background writes)
        report['iteration'] = updater.iteration
        report['t'] = int(opt.t)
        if shard:
            owned = {n for n, r in zip(opt._mn_shard.names, opt._mn_shard.owners) if r == comm.rank}
            report['owned'] = sorted(owned)
        report['state_after'] = sorted(n for n, p in model.namedparams() if p.update_rule.state is not None)
        numpy.savez(os.path.join(out, '{}.{}.npz'.format(tag, comm.rank)),
                    **{n.replace('/', '_'): p.array for n, p in model.namedparams()})
    except Exception as e:   # every rank raises the loader's errors alike
        report['error'] = '{}: {}'.format(type(e).__name__, e)
    finally:
        cp.finalize()
    with open(os.path.join(out, '{}.{}.json'.format(tag, comm.rank)), 'w') as f:
        json.dump(report, f)


def main(out, plan):
    comm = chainermn.create_communicator('naive')
    for step in plan.split(','):
        tag, where, shard, stop = step.split(':')
        run(comm, out, tag, where, bool(int(shard)), int(stop))
        comm.mpi_comm.Barrier()
    print('rank {} plan done'.format(comm.rank), flush=True)


if __name__ == '__main__':
    main(*sys.argv[1:3])
