"""The extensions of later ChainerMN versions on every rank (run under mpiexec by test_later_extensions.py).

ObservationAggregator, MultiNodeEarlyStoppingTrigger, GenericMultiNodeEvaluator, multi_node_snapshot.
"""

import os
import shutil
import tempfile
import warnings

import chainer
import numpy
import pytest
from chainer import training
from chainer.training import extension
from chainer.training import extensions as chainer_extensions
from chainer.training import triggers

import chainermn_comm
from chainermn_comm.testing import shared_tmpdir
from chainermn_train.extensions import (GenericMultiNodeEvaluator, MultiNodeEarlyStoppingTrigger,
                                        ObservationAggregator, multi_node_snapshot)


@pytest.fixture(scope='module')
def comm():
    return chainermn_comm.create_communicator('naive')


class _Net(chainer.Chain):
    def __init__(self):
        super().__init__()
        with self.init_scope():
            self.l = chainer.links.Linear(1, 1, initialW=0, initial_bias=0)


class _ScriptedUpdater(training.StandardUpdater):
    """Reports ``values(iteration)`` (iteration counted from 1) and adds ``step`` to the weight."""

    def __init__(self, values, step=0.0):
        data = chainer.datasets.TupleDataset(numpy.zeros((4, 1), numpy.float32))
        model = _Net()
        opt = chainer.optimizers.SGD()
        opt.setup(model)
        super().__init__(chainer.iterators.SerialIterator(data, 2), opt)
        self.values = values
        self.step = step
        self.model = model

    def update_core(self):
        self.model.l.W.array += self.step
        chainer.report(self.values(self.iteration + 1))


class _Spy(extension.Extension):
    """Records the observation after the editors (aggregators) ran, before the readers."""

    trigger = 1, 'iteration'
    priority = extension.PRIORITY_EDITOR - 1

    def __init__(self):
        self.seen = {}

    def __call__(self, trainer):
        self.seen[trainer.updater.iteration] = dict(trainer.observation)


def _trainer(values, stop, out=None, step=0.0):
    return training.Trainer(_ScriptedUpdater(values, step), stop, out=out or tempfile.gettempdir())


# -- ObservationAggregator ------------------------------------------------------------------------

def test_aggregator_means_over_ranks_and_iterations_at_comm_trigger(comm):
    r = comm.rank

    def values(i):
        # A Variable (the case that needs a ChainerX device elsewhere) and a plain float.
        return {'main/loss': chainer.Variable(numpy.array(r + i, numpy.float32)), 'main/x': float(r)}

    tr = _trainer(values, (5, 'iteration'))
    tr.extend(ObservationAggregator(comm, 'main/loss', 'main/agg', comm_trigger=(2, 'iteration')))
    tr.extend(ObservationAggregator(comm, 'main/x'))  # aggregated_key None: overwrite the key
    spy = _Spy()
    tr.extend(spy)
    tr.run()
    mean_rank = (comm.size - 1) / 2.0
    for it in range(1, 6):
        obs = spy.seen[it]
        assert float(obs['main/x']) == pytest.approx(mean_rank)
        assert obs['main/loss'].array.item() == r + it  # the original key is left alone
        if it % 2:
            assert 'main/agg' not in obs, it
        else:  # mean of iterations it-1 and it over all ranks
            assert float(obs['main/agg']) == pytest.approx(mean_rank + it - 0.5), it
    all_seen = comm.allgather_obj(float(spy.seen[4]['main/agg']))
    assert all_seen == [all_seen[0]] * comm.size


def test_aggregator_custom_function_gets_one_list_per_rank(comm):
    r = comm.rank
    calls = []

    def aggregate(histories):
        calls.append(histories)
        return max(v for h in histories for v in h)

    def values(i):
        return {'main/v': numpy.float64(10 * r + i)} if r != 1 or i > 2 else {}

    tr = _trainer(values, (3, 'iteration'))
    tr.extend(ObservationAggregator(comm, 'main/v', 'main/max', comm_trigger=(3, 'iteration'),
                                    aggregator=aggregate))
    spy = _Spy()
    tr.extend(spy)
    tr.run()
    assert float(spy.seen[3]['main/max']) == 10 * (comm.size - 1) + 3
    if r == 0:  # the aggregator runs once, on rank 0, with each rank's values in rank order
        want = [[10 * q + i for i in (range(3, 4) if q == 1 else range(1, 4))] for q in range(comm.size)]
        assert [[float(v) for v in h] for h in calls[0]] == want and len(calls) == 1
    else:
        assert calls == []


def test_aggregator_elementwise_mean_of_arrays_and_missing_key(comm):
    def values(i):
        return {'main/a': numpy.array([comm.rank, 2.0 * comm.rank], numpy.float32)}

    tr = _trainer(values, (2, 'iteration'))
    tr.extend(ObservationAggregator(comm, 'main/a', 'main/am'))
    tr.extend(ObservationAggregator(comm, 'main/nowhere', 'main/never'))
    spy = _Spy()
    tr.extend(spy)
    tr.run()
    m = (comm.size - 1) / 2.0
    numpy.testing.assert_allclose(spy.seen[2]['main/am'], [m, 2 * m])
    assert 'main/never' not in spy.seen[2]


def test_aggregator_failure_on_rank_0_raises_everywhere(comm):
    def bad(histories):
        raise KeyError('boom')

    tr = _trainer(lambda i: {'main/v': 1.0}, (2, 'iteration'))
    tr.extend(ObservationAggregator(comm, 'main/v', aggregator=bad))
    with pytest.raises(Exception, match='boom'):
        tr.run(show_loop_exception_msg=False)


# -- MultiNodeEarlyStoppingTrigger ----------------------------------------------------------------

#: Mean over ranks of the monitored value at iterations 1, 2, ...: improves 3 times, then stalls.
MEAN_LOSS = [5.0, 4.0, 3.0, 3.5, 3.2, 2.5, 9.0, 9.0, 9.0, 9.0, 9.0, 9.0]


def _offset(rank, size, it):
    """Per-rank deviation that sums to zero over ranks and flips sign every iteration."""
    return (rank - (size - 1) / 2.0) * 3.0 * (-1) ** it


def _reference_stop(values, **kwargs):
    """Iteration at which Chainer's single-process EarlyStoppingTrigger stops on ``values``."""
    tr = _trainer(lambda i: {kwargs['monitor']: values[i - 1]}, None)
    tr.stop_trigger = triggers.EarlyStoppingTrigger(**kwargs)
    tr.run()
    return tr.updater.iteration


def _stop_iteration(comm, values_fn, **kwargs):
    trigger = MultiNodeEarlyStoppingTrigger(comm, **kwargs)
    tr = _trainer(values_fn, trigger)
    tr.run()
    its = comm.allgather_obj(tr.updater.iteration)
    assert its == [its[0]] * comm.size, its  # every rank stops at the same iteration
    return its[0], trigger


def test_early_stopping_on_mean_over_ranks_like_chainer_on_the_mean(comm):
    kwargs = dict(check_trigger=(1, 'iteration'), monitor='main/loss', patience=2,
                  max_trigger=(len(MEAN_LOSS), 'iteration'))
    want = _reference_stop(MEAN_LOSS, **kwargs)
    assert want == 5  # best 3.0 at iteration 3, no better at 4 and 5

    def values(i):
        return {'main/loss': numpy.float32(MEAN_LOSS[i - 1] + _offset(comm.rank, comm.size, i))}

    got, trigger = _stop_iteration(comm, values, **kwargs)
    assert got == want
    assert trigger.best == pytest.approx(3.0) and trigger.count == 2
    assert trigger.get_training_length() == (len(MEAN_LOSS), 'iteration')


def test_early_stopping_positional_arguments_max_mode_and_check_interval(comm):
    acc = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.55, 0.5, 0.45, 0.4, 0.6, 0.6, 0.3, 0.3, 0.3, 0.3]
    # check every 2 iterations on the mean of those 2: 0.15, 0.35, 0.55, 0.525, 0.425, 0.6, 0.3, 0.3
    kwargs = dict(check_trigger=(2, 'iteration'), monitor='main/accuracy', patience=2,
                  max_trigger=(len(acc), 'iteration'))
    want = _reference_stop(acc, **kwargs)
    assert want == 10

    def values(i):
        return {'main/accuracy': acc[i - 1] + _offset(comm.rank, comm.size, i) / 10.0}

    trigger = MultiNodeEarlyStoppingTrigger(comm, (2, 'iteration'), 'main/accuracy', 2, 'auto', False,
                                            (len(acc), 'iteration'))
    tr = _trainer(values, trigger)
    tr.run()
    assert tr.updater.iteration == want
    assert trigger.best == pytest.approx(0.55)
    # mode='min' on the same values stops at the third check (no better than 0.15 twice).
    got, _ = _stop_iteration(comm, values, mode='min', **kwargs)
    assert got == 6


def test_early_stopping_max_trigger_and_missing_key_on_some_ranks(comm):
    # Only rank 0 observes the key: its values decide; the trigger still agrees on every rank.
    def values(i):
        return {'main/loss': float(10 - i)} if comm.rank == 0 else {}

    got, trigger = _stop_iteration(comm, values, check_trigger=(1, 'iteration'), patience=1,
                                   max_trigger=(7, 'iteration'))
    assert got == 7 and trigger.best == pytest.approx(4.0)  # iteration 7 stops before its check
    # No rank observes it: every rank warns (the filters act alike), rank 0 alone shows it.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        got, _ = _stop_iteration(comm, lambda i: {}, check_trigger=(1, 'iteration'),
                                 max_trigger=(3, 'iteration'))
    assert got == 3
    shown = [str(w.message) for w in caught if 'main/loss' in str(w.message)]
    assert len(shown) == (2 if comm.rank == 0 else 0), shown   # checks at iterations 1 and 2
    with warnings.catch_warnings():
        warnings.simplefilter('error')   # raises on every rank at the same check
        with pytest.raises(UserWarning, match='main/loss is not in the observation of any rank'):
            _stop_iteration(comm, lambda i: {}, check_trigger=(1, 'iteration'),
                            max_trigger=(3, 'iteration'))


def test_early_stopping_rejects_bad_arguments(comm):
    with pytest.raises(ValueError, match='mode'):
        MultiNodeEarlyStoppingTrigger(comm, mode='bigger')
    with pytest.raises(ValueError, match='patience'):
        MultiNodeEarlyStoppingTrigger(comm, patience=-1)
    t = MultiNodeEarlyStoppingTrigger(comm)
    assert (t.monitor, t.patience, t.verbose) == ('main/loss', 3, False)
    assert t.get_training_length() == (100, 'epoch')


# -- GenericMultiNodeEvaluator --------------------------------------------------------------------

def _local_data(rank):
    """Rank r holds 2r + 3 examples valued 100 r + i (so 2, 3, 4, ... batches of 2)."""
    return [numpy.float32(100 * rank + i) for i in range(2 * rank + 3)]


def _expected_rounds(size, batch=2):
    batches = []
    for r in range(size):
        d = [100 * r + i for i in range(2 * r + 3)]
        batches.append([(r, d[k:k + batch]) for k in range(0, len(d), batch)])
    out = []
    for k in range(max(len(b) for b in batches)):
        out += [b[k] for b in batches if k < len(b)]
    return out


class _Collect(GenericMultiNodeEvaluator):
    def calc_local(self, x):
        assert not chainer.config.enable_backprop
        return (self.comm.rank, [float(v) for v in x])

    def aggregate(self, results):
        chainer.report({'validation/n': len(results)})
        return results


@pytest.mark.parametrize('root_at', ['first', 'last'])
def test_generic_evaluator_gathers_every_result_on_root(comm, root_at):
    root = 0 if root_at == 'first' else comm.size - 1
    it = chainer.iterators.SerialIterator(_local_data(comm.rank), 2, repeat=False, shuffle=False)
    hooked = []
    ev = _Collect(comm, it, None, converter=lambda batch, device=None: numpy.stack(batch), root=root,
                  progress_hook=hooked.append)
    for _ in range(2):  # the iterator is reset: a second call gives the same
        got = ev()
        if comm.rank == root:
            want = _expected_rounds(comm.size)
            assert [(r, [int(v) for v in xs]) for r, xs in got] == want
        else:
            assert got is None
    if comm.rank == root:
        assert [list(b) for b in hooked] == [list(b) for b in _batches(_local_data(root))] * 2
    else:
        assert hooked == []


def _batches(data, batch=2):
    return [data[k:k + batch] for k in range(0, len(data), batch)]


def test_generic_evaluator_defaults_call_the_target_and_return_the_list(comm):
    data = [(numpy.array([comm.rank + i], numpy.float32), numpy.int32(i)) for i in range(comm.rank + 1)]
    it = chainer.iterators.SerialIterator(data, 5, repeat=False, shuffle=False)
    ev = GenericMultiNodeEvaluator(comm, it, lambda x, t: float(x.sum() + 1000 * t.sum()))
    assert (ev.trigger, ev.default_name) == ((1, 'epoch'), 'validation')
    assert ev.priority == extension.PRIORITY_WRITER
    got = ev()
    if comm.rank == 0:
        want = [float(sum(r + i for i in range(r + 1)) + 1000 * sum(range(r + 1))) for r in range(comm.size)]
        assert got == want
    else:
        assert got is None


def test_generic_evaluator_dict_batches_and_trainer_reporting(comm):
    class Ev(GenericMultiNodeEvaluator):
        def calc_local(self, x, t):
            return int(numpy.sum(x == t))

        def aggregate(self, results):
            chainer.report({'validation/main/correct': float(sum(results))})

    n = comm.rank + 2
    data = [{'x': numpy.int32(i % 2), 't': numpy.int32(0)} for i in range(n)]
    it = chainer.iterators.SerialIterator(data, 1, repeat=False, shuffle=False)
    ev = Ev(comm, it, None)
    tr = _trainer(lambda i: {}, (2, 'iteration'))
    tr.extend(ev, trigger=(2, 'iteration'))
    spy = _Spy()
    spy.priority = extension.PRIORITY_READER
    tr.extend(spy)
    tr.run()
    want = sum((r + 2 + 1) // 2 for r in range(comm.size))
    if comm.rank == 0:
        assert spy.seen[2]['validation/main/correct'] == want
    else:
        assert 'validation/main/correct' not in spy.seen[2]


def test_generic_evaluator_failure_on_one_rank_raises_on_every_rank(comm):
    bad = comm.size - 1

    class Ev(GenericMultiNodeEvaluator):
        def calc_local(self, x):
            if self.comm.rank == bad and float(x[0]) >= 100 * bad + 2:
                raise ValueError('bad batch')
            return 1

    it = chainer.iterators.SerialIterator(_local_data(comm.rank), 2, repeat=False, shuffle=False)
    ev = Ev(comm, it, None, converter=lambda batch, device=None: numpy.stack(batch))
    with pytest.raises((ValueError, RuntimeError), match='bad batch'):
        ev()
    # The ranks are still in step afterwards.
    assert comm.allreduce_obj(1) == comm.size


def test_generic_evaluator_rejects_repeating_iterator_and_bad_root(comm):
    with pytest.raises(ValueError, match='repeat'):
        GenericMultiNodeEvaluator(comm, chainer.iterators.SerialIterator([1], 1), None)
    with pytest.raises(ValueError, match='root'):
        GenericMultiNodeEvaluator(comm, chainer.iterators.SerialIterator([1], 1, repeat=False), None,
                                  root=comm.size)


# -- multi_node_snapshot --------------------------------------------------------------------------

@pytest.fixture
def shared_dir(comm):
    path = shared_tmpdir(comm, 'mn-snapshot-')
    yield path
    comm.allreduce_obj(0)  # everyone is done with it
    if comm.rank == 0:
        shutil.rmtree(path, ignore_errors=True)


def _files(comm, path):
    """List ``path`` once every rank's run has finished, before any rank starts the next one."""
    comm.allreduce_obj(0)
    names = sorted(os.listdir(path))
    comm.allreduce_obj(0)
    return names


def _snapshot_run(comm, out, stop, replica_sets, autoload=True, **snapshot_kwargs):
    tr = _trainer(lambda i: {}, (stop, 'iteration'), out=out, step=comm.rank + 1.0)
    snap = chainer_extensions.snapshot(autoload=autoload, **snapshot_kwargs)
    tr.extend(multi_node_snapshot(comm, snap, replica_sets), trigger=(2, 'iteration'))
    tr.run()
    return tr


def test_snapshot_once_per_replica_set_and_resume_from_the_master(comm, shared_dir):
    tr = _snapshot_run(comm, shared_dir, 4, [0], filename='snap_{.updater.iteration}')
    assert tr.updater.model.l.W.array.item() == 4 * (comm.rank + 1)
    masters = [0] if comm.size == 1 else [0, 1]
    want = sorted('snap_{}.{}'.format(i, m) for i in (2, 4) for m in masters)
    assert _files(comm, shared_dir) == want
    # A new job (same size) resumes: every rank takes its replica set master's state at iteration 4.
    tr = _snapshot_run(comm, shared_dir, 6, [0], filename='snap_{.updater.iteration}')
    master = 0 if comm.rank == 0 else 1
    assert tr.updater.iteration == 6
    assert tr.updater.model.l.W.array.item() == 4 * (master + 1) + 2 * (comm.rank + 1)


def test_snapshot_fresh_start_keeps_every_rank_s_own_state(comm, shared_dir):
    tr = _trainer(lambda i: {}, (1, 'iteration'), out=shared_dir, step=1.0)
    tr.updater.model.l.W.array[...] = 10.0 * comm.rank
    tr.extend(multi_node_snapshot(comm, chainer_extensions.snapshot(autoload=True), [0]),
              trigger=(2, 'iteration'))
    tr.run()
    assert tr.updater.model.l.W.array.item() == 10.0 * comm.rank + 1.0
    assert _files(comm, shared_dir) == []


def test_snapshot_callable_filename_and_every_rank_its_own_set(comm, shared_dir):
    def name(trainer):
        return 'cb_{}'.format(trainer.updater.iteration)

    sets = [[r] for r in range(comm.size)]
    # (Chainer's autoload cannot search for files named by a function.)
    _snapshot_run(comm, shared_dir, 2, sets, autoload=False, filename=name)
    assert _files(comm, shared_dir) == sorted('cb_2.{}'.format(r) for r in range(comm.size))


def test_snapshot_one_set_for_all_ranks_loads_rank_0_everywhere(comm, shared_dir):
    _snapshot_run(comm, shared_dir, 2, [])
    assert _files(comm, shared_dir) == ['snapshot_iter_2.0']
    tr = _snapshot_run(comm, shared_dir, 3, [])
    assert tr.updater.model.l.W.array.item() == 2 * 1 + (comm.rank + 1)


def test_snapshot_without_autoload_writes_but_does_not_load(comm, shared_dir):
    tr = _trainer(lambda i: {}, (2, 'iteration'), out=shared_dir, step=1.0)
    tr.extend(multi_node_snapshot(comm, chainer_extensions.snapshot(), [0]), trigger=(2, 'iteration'))
    tr.run()
    tr = _trainer(lambda i: {}, (1, 'iteration'), out=shared_dir, step=1.0)
    ext = multi_node_snapshot(comm, chainer_extensions.snapshot(), [0])
    tr.extend(ext, trigger=(2, 'iteration'))
    tr.run()
    assert tr.updater.iteration == 1 and tr.updater.model.l.W.array.item() == 1.0
    assert ext.is_master == (comm.rank in (0, 1))
