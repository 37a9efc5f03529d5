"""Evaluator, AllreducePersistent, checkpointer and trainer on every rank (run under mpiexec)."""

import os
import sys
import warnings

import chainer
import chainer.links as L
import numpy
import pytest
from chainer.training import extensions

from chainermn_comm.testing import shared_tmpdir

sys.path.insert(0, os.path.dirname(__file__))
import _common  # noqa: E402

import chainermn_train  # noqa: E402
from chainermn_train.extensions import AllreducePersistent  # noqa: E402
from chainermn_train.checkpoint import CheckpointWarning  # noqa: E402


class Reporter(chainer.Link):
    """Reports the mean of its inputs as 'value' (per-example metric = the example itself)."""

    def forward(self, x):
        chainer.report({'value': numpy.mean(x)}, self)
        return x


def _uneven(comm, per):
    """Rank r holds per*(r+1) examples with values offset by r (different means per rank)."""
    n = per * (comm.rank + 1)
    return [numpy.float64(10.0 * comm.rank + i) for i in range(n)]


def _global(comm, per):
    allv = []
    for r in range(comm.size):
        allv += [10.0 * r + i for i in range(per * (r + 1))]
    return float(numpy.mean(allv))


def _batch_means(comm, per, batch):
    means = []
    for r in range(comm.size):
        values = [10.0 * r + i for i in range(per * (r + 1))]
        means += [numpy.mean(values[i:i + batch]) for i in range(0, len(values), batch)]
    return float(numpy.mean(means))


@pytest.mark.parametrize('batch', [2, 100])
def test_evaluator_weighted_mean(batch):
    comm = _common.comm()
    data = _uneven(comm, 2)   # sizes 2, 4, 6: divisible by batch 2, one batch with 100
    it = chainer.iterators.SerialIterator(data, batch, repeat=False, shuffle=False)
    ev = extensions.Evaluator(it, Reporter(), converter=lambda b, d=None: numpy.array(b))
    ev = chainermn_train.create_multi_node_evaluator(ev, comm)
    res = ev()   # Evaluator.__call__ sets up the reporter and calls the patched evaluate
    assert ev._mn_last_counts == [2 * (r + 1) for r in range(comm.size)], res
    # Chainer's Evaluator over every rank's batches: each batch's mean counts once.
    assert ev._mn_last_weights == [{'main/value': float(-(-2 * (r + 1) // batch))} for r in range(comm.size)]
    assert res['main/value'] == pytest.approx(_batch_means(comm, 2, batch), rel=1e-12)
    res2 = ev()   # repeatable
    assert res2['main/value'] == pytest.approx(res['main/value'], rel=1e-15)


class CustomEvaluator(extensions.Evaluator):
    def evaluate(self):
        it = self.get_iterator('main')
        it.reset()
        total = 0.0
        n = 0
        for batch in it:
            total += float(sum(batch))
            n += len(batch)
        return {'custom/mean': total / n, 'custom/rank_const': 1.0}


def test_custom_evaluator_subclass():
    comm = _common.comm()
    data = _uneven(comm, 1)   # sizes 1, 2, 3
    it = chainer.iterators.SerialIterator(data, 2, repeat=False, shuffle=False)
    ev = chainermn_train.create_multi_node_evaluator(CustomEvaluator(it, Reporter()), comm)
    res = ev()
    assert res['custom/mean'] == pytest.approx(_global(comm, 1), rel=1e-12)
    assert res['custom/rank_const'] == pytest.approx(1.0)


def test_allreduce_persistent():
    comm = _common.comm()
    model = chainer.Sequential(L.BatchNormalization(3, dtype=numpy.float32))
    bn = model[0]
    bn.avg_mean[...] = numpy.arange(3, dtype=numpy.float32) + comm.rank
    bn.avg_var[...] = 2.0 * comm.rank
    bn.N = 5 + comm.rank
    AllreducePersistent(model, comm)()
    mean_rank = (comm.size - 1) / 2.0
    numpy.testing.assert_allclose(bn.avg_mean, numpy.arange(3) + mean_rank, rtol=1e-6)
    numpy.testing.assert_allclose(bn.avg_var, numpy.full(3, 2.0 * mean_rank), rtol=1e-6)
    assert bn.avg_mean.dtype == numpy.float32
    assert bn.N == 5 + comm.rank   # integer persistent left alone


def _shared_tmpdir(comm):
    return shared_tmpdir(comm, 'cmn_train_')


def test_checkpointer_save_load_gc_and_fallback():
    comm = _common.comm()
    path = _shared_tmpdir(comm)
    # Synchronous: the files are listed right after each save (background saves: test_background_checkpoint_mpi).
    cp = chainermn_train.create_multi_node_checkpointer('run', comm, cp_interval=2, gc_interval=2,
                                                        path=path, background=False)
    assert chainermn_train.create_multi_node_checkpoint is chainermn_train.create_multi_node_checkpointer
    model = _common.make_model(3)
    for it in range(1, 6):
        for p in model.params():
            p.array[...] = it + comm.rank
        cp.save(model, iteration=it)
    # gc after saves 2 and 4 keeps the newest 2; save 5 was added after
    assert cp.local_iterations() == [3, 4, 5]
    comm.mpi_comm.Barrier()   # every rank finished saving
    assert sorted(n for n in os.listdir(path) if not n.startswith('.')) == sorted(
        'run.{}.{}'.format(r, i) for r in range(comm.size) for i in (3, 4, 5))
    # and the job's owner records, one per rank (see ownership.owner)
    assert sorted(n for n in os.listdir(path) if n.startswith('.')) == sorted(
        '.run.{}.owner'.format(r) for r in range(comm.size))
    stats = cp.get_stats()
    assert stats['saves'] == 5 and stats['files_removed'] == 2

    fresh = _common.make_model(4)
    cp2 = chainermn_train.create_multi_node_checkpointer('run', comm, path=path)
    assert cp2.maybe_load(fresh) == 5
    assert all(numpy.all(p.array == 5 + comm.rank) for p in fresh.params())

    # the last rank's newest file is truncated, the first rank's iteration 4 is corrupt
    last = comm.size - 1
    if comm.rank == last:
        fn = cp.filename(5)
        size = os.path.getsize(fn)
        with open(fn, 'r+b') as f:
            f.truncate(size // 2)
    if comm.rank == 0:
        with open(cp.filename(4), 'r+b') as f:
            f.seek(200)
            f.write(b'\xff' * 64)
    comm.mpi_comm.Barrier()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter('always')
        assert cp2.maybe_load(fresh) == 3
    assert any(issubclass(x.category, CheckpointWarning) for x in w) == (comm.rank == 0)   # once, rank 0
    assert all(numpy.all(p.array == 3 + comm.rank) for p in fresh.params())

    # a rank without any file: every rank takes the newest generation from rank 0's file
    if comm.size > 1 and comm.rank == 1:
        cp.cleanup()
    comm.mpi_comm.Barrier()
    if comm.size > 1:
        assert cp2.maybe_load(fresh) == 5
        assert all(numpy.all(p.array == 5) for p in fresh.params())
        assert cp2.get_stats()['load_mode'].startswith('resharded from ' + cp.filename(5, 0))
    cp.cleanup()
    comm.mpi_comm.Barrier()
    assert cp.local_iterations() == []


def _trainer(comm, out, stop, log=True, fail_at=None):
    model = L.Classifier(_common.make_model(100), lossfun=chainer.functions.mean_squared_error)
    model.compute_accuracy = False
    x, y = _common.data(8 * comm.size, seed=5)
    train = list(zip(x[comm.rank::comm.size], y[comm.rank::comm.size]))
    test = list(zip(x[:2 * (comm.rank + 1)], y[:2 * (comm.rank + 1)]))   # uneven parts
    opt = chainermn_train.create_multi_node_optimizer(chainer.optimizers.SGD(lr=0.05), comm)
    opt.setup(model)
    it = chainer.iterators.SerialIterator(train, 2, shuffle=False)
    updater = chainer.training.StandardUpdater(it, opt)
    trainer = chainer.training.Trainer(updater, (stop, 'iteration'), out=out)
    ev = extensions.Evaluator(chainer.iterators.SerialIterator(test, 100, repeat=False, shuffle=False),
                              model)
    trainer.extend(chainermn_train.create_multi_node_evaluator(ev, comm), trigger=(2, 'iteration'))
    if fail_at is not None:
        def boom(t):
            if t.updater.iteration == fail_at:
                raise RuntimeError('planned failure')
        trainer.extend(boom, trigger=(1, 'iteration'))
    if log and comm.rank == 0:
        trainer.extend(extensions.LogReport(trigger=(2, 'iteration')))
        trainer.extend(extensions.PrintReport(['iteration', 'main/loss', 'validation/main/loss']))
        trainer.extend(extensions.ProgressBar(update_interval=1))
    return trainer, model


def test_trainer_rank0_reports_and_checkpoint_cleanup():
    comm = _common.comm()
    out = _shared_tmpdir(comm)
    trainer, model = _trainer(comm, out, stop=6)
    cp = chainermn_train.create_multi_node_checkpointer('tr', comm, path=os.path.join(out, 'cp'))
    trainer.extend(cp, trigger=(2, 'iteration'))
    assert cp.maybe_load(trainer, trainer.updater.get_optimizer('main')) is None
    trainer.run()
    assert cp.get_stats()['saves'] == 3
    assert cp.local_iterations() == []   # removed after the normal end
    comm.mpi_comm.Barrier()   # every rank finished: the last one removed the folder it made
    assert not os.path.exists(os.path.join(out, 'cp')), os.listdir(os.path.join(out, 'cp'))
    assert os.path.isdir(out)   # the trainer's folder, made before: kept
    log = os.path.join(out, 'log')
    if comm.rank == 0:
        import json
        with open(log) as f:
            entries = json.load(f)
        assert [e['iteration'] for e in entries] == [2, 4, 6]
        assert all('validation/main/loss' in e for e in entries)
    # identical parameters on every rank
    for name, p in sorted(model.namedparams()):
        arrays = comm.allgather(p.array)
        assert all(numpy.array_equal(a, arrays[0]) for a in arrays), name


def test_checkpoint_kept_after_failure_and_resumed():
    comm = _common.comm()
    out = _shared_tmpdir(comm)
    cpdir = os.path.join(out, 'cp')
    trainer, _ = _trainer(comm, out, stop=8, log=False, fail_at=5)
    cp = chainermn_train.create_multi_node_checkpointer('f', comm, path=cpdir)
    trainer.extend(cp, trigger=(2, 'iteration'))
    with pytest.raises(RuntimeError, match='planned failure'):
        trainer.run(show_loop_exception_msg=False)
    assert cp.local_iterations() == [2, 4]
    trainer2, model2 = _trainer(comm, out, stop=8, log=False)
    cp2 = chainermn_train.create_multi_node_checkpointer('f', comm, path=cpdir)
    trainer2.extend(cp2, trigger=(2, 'iteration'))
    assert cp2.maybe_load(trainer2, trainer2.updater.get_optimizer('main')) == 4
    assert trainer2.updater.iteration == 4
    trainer2.run()
    assert trainer2.updater.iteration == 8
    assert cp2.local_iterations() == []
    comm.mpi_comm.Barrier()   # the folder the failed run made is removed by the run that completed
    assert not os.path.exists(cpdir)
    ref, ref_model = _trainer(comm, os.path.join(out, 'ref'), stop=8, log=False)
    ref.run()
    for (n1, p1), (n2, p2) in zip(sorted(model2.namedparams()), sorted(ref_model.namedparams())):
        assert numpy.array_equal(p1.array, p2.array), n1


def test_a_folder_the_checkpointer_did_not_make_stays():
    comm = _common.comm()
    out = _shared_tmpdir(comm)   # made before the checkpointer, as a user would
    trainer, _ = _trainer(comm, out, stop=4, log=False)
    cp = chainermn_train.create_multi_node_checkpointer('kept', comm, path=out)
    trainer.extend(cp, trigger=(2, 'iteration'))
    trainer.run()
    comm.mpi_comm.Barrier()
    assert os.path.isdir(out) and not [n for n in os.listdir(out) if n.startswith(('kept.', '.kept.'))]


class Running(chainer.Link):
    """Reports the running sum of its inputs since ``reset_state`` (state kept across batches, like an RNN)."""

    def __init__(self):
        super().__init__()
        self.reset_state()

    def reset_state(self):
        self.total = 0.0

    def forward(self, x):
        self.total += float(numpy.sum(x))
        chainer.report({'running': self.total}, self)
        return x


class NoResetIterator(chainer.dataset.Iterator):
    """An iterator without ``reset()`` (like Chainer's ptb ParallelSequentialIterator): copied per evaluation."""

    def __init__(self, data, batch):
        self.data, self.batch, self.pos = data, batch, 0

    def __next__(self):
        if self.pos >= len(self.data):
            raise StopIteration
        self.pos += self.batch
        return self.data[self.pos - self.batch:self.pos]


def test_evaluator_eval_hook_resets_state_on_every_rank():
    """Issue 44 (docs/converting.md): ``Evaluator(eval_hook=...)`` under the multi-node evaluator."""
    comm = _common.comm()
    data = _uneven(comm, 2)   # sizes 2, 4, 6
    target = Running()
    calls = []

    def hook(evaluator):
        calls.append(evaluator)
        target.reset_state()

    ev = extensions.Evaluator(NoResetIterator(data, 2), target, eval_hook=hook,
                              converter=lambda b, d=None: numpy.array(b))
    ev = chainermn_train.create_multi_node_evaluator(ev, comm)
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')   # Chainer's "does not have the reset method" deprecation
        first, second = ev(), ev()
    assert calls == [ev, ev]   # once per evaluation, on every rank
    num = den = 0.0
    for r in range(comm.size):
        values = [10.0 * r + i for i in range(2 * (r + 1))]
        sums = numpy.cumsum([values[i] + values[i + 1] for i in range(0, len(values), 2)])
        num += len(values) * float(numpy.mean(sums))
        den += len(values)
    assert first['main/running'] == pytest.approx(num / den, rel=1e-12)
    assert second['main/running'] == pytest.approx(num / den, rel=1e-12)   # the hook reset the state
