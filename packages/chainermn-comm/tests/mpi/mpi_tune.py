"""Per-rank tests of the tuner (``reduce.tune``): one schedule, one decision on every rank (run by test_tune_mpi.py)."""

import logging
import sys
import types

import numpy
import pytest
from mpi4py import MPI

import chainermn_comm
from chainermn_comm.reduce import schedule as _schedule
from chainermn_comm.reduce import tune as _tune
from chainermn_comm._errors import CommunicationError

COMM = MPI.COMM_WORLD


def _run(tuner, seconds_of):
    """Drive ``tuner`` until its schedule ends; ``seconds_of(cfg)`` is this rank's time of a call."""
    tuner.record(0.0)  # the warm-up call
    calls = 1
    while tuner.tuning:
        cfg = tuner.config()
        tuner.record(seconds_of(cfg))
        calls += 1
    return calls


def test_the_slowest_rank_decides_and_every_rank_agrees():
    # Rank 0 finds 'b' fastest, but on the last rank 'b' is the slowest: the slowest rank's
    # times make 'c' the choice everywhere.
    last = COMM.Get_size() - 1
    times = {'a': 2.5, 'b': 1.0, 'c': 2.1}
    tuner = _tune.Tuner(COMM, 'test', [('x', lambda c: ('a', 'b', 'c'))], {'x': 'a'})
    seen = []

    def seconds(cfg):
        seen.append(cfg['x'])
        if COMM.Get_rank() == last and cfg['x'] == 'b' and COMM.Get_size() > 1:
            return 9.0
        return times[cfg['x']]
    calls = _run(tuner, seconds)
    if COMM.Get_size() > 1:
        # Round 1 (slowest rank): a 2.5, b 9.0, c 2.1: b is out (more than DROP_FIRST x c);
        # rounds 2 and 3 time the others again, in reverse order and then forward.
        assert seen == ['a', 'b', 'c', 'c', 'a', 'a', 'c'] and calls == 8
        assert tuner.history[0][1]['x'] == {'a': 2.5, 'b': 9.0, 'c': 2.1}
    else:  # b 1.0 leaves a and c (2.5 and 2.1: over DROP_FIRST) out after round 1
        assert seen == ['a', 'b', 'c'] and calls == 4
    assert tuner.choice == {'x': 'c' if COMM.Get_size() > 1 else 'b'}
    assert tuner.history[0][0] == calls
    assert COMM.allgather(tuner.choice) == [tuner.choice] * COMM.Get_size()


def test_a_first_call_that_paid_for_its_buffers_is_timed_again():
    # b's first call is slow (1.8x a: under DROP_FIRST), its later calls fast: b stays in the race
    # and wins on its best call; a value DROP_FIRST times slower after round 1 is out at once.
    assert 1.8 <= _tune.DROP_FIRST < 3.0
    calls = {'a': 0, 'b': 0, 'c': 0}

    def seconds(cfg):
        calls[cfg['x']] += 1
        return {'a': 1.0, 'b': 1.8 if calls['b'] == 1 else 0.8, 'c': 3.0}[cfg['x']]
    tuner = _tune.Tuner(COMM, 'test', [('x', lambda c: ('a', 'b', 'c'))], {'x': 'a'})
    _run(tuner, seconds)
    assert tuner.choice == {'x': 'b'} and calls == {'a': _tune.SAMPLES, 'b': _tune.SAMPLES, 'c': 1}


def test_the_current_value_has_no_first_call_allowance():
    # The current value ran before (the warm-up): 1.5x the best after one call is out at once,
    # while a new value 1.5x the best gets a second call (it may have paid for its buffers).
    calls = {'cur': 0, 'new': 0, 'fast': 0}

    def seconds(cfg):
        calls[cfg['x']] += 1
        return {'cur': 1.5, 'new': 1.5, 'fast': 1.0}[cfg['x']]
    tuner = _tune.Tuner(COMM, 'test', [('x', lambda c: ('cur', 'new', 'fast'))], {'x': 'cur'})
    _run(tuner, seconds)
    assert tuner.choice == {'x': 'fast'} and calls == {'cur': 1, 'new': 2, 'fast': 2}, calls


def test_a_challenger_must_win_by_the_margin():
    times = {'keep': 1.0, 'close': 1.0 - _tune.MARGIN / 2, 'far': 1.0 - 2 * _tune.MARGIN}
    tuner = _tune.Tuner(COMM, 'test', [('x', lambda c: ('keep', 'close'))], {'x': 'keep'})
    _run(tuner, lambda cfg: times[cfg['x']])
    assert tuner.choice['x'] == 'keep'
    tuner = _tune.Tuner(COMM, 'test', [('x', lambda c: ('keep', 'far'))], {'x': 'keep'})
    _run(tuner, lambda cfg: times[cfg['x']])
    assert tuner.choice['x'] == 'far'


def test_axes_follow_each_other_and_skip_single_values():
    order = []

    def second(c):
        order.append(('second sees', c['x']))
        return (1, 2)
    tuner = _tune.Tuner(COMM, 'test', [('x', lambda c: ('p', 'q')), ('none', lambda c: ()), ('y', second)],
                        {'x': 'p', 'y': 1})
    _run(tuner, lambda cfg: {'p': 2.0, 'q': 1.0}[cfg['x']] + cfg['y'])
    # The next axis starts from the choice so far (and is looked at, to plan the calls left, with
    # the leader of the axis before it).
    assert order and set(order) == {('second sees', 'q')}, order
    assert tuner.choice == {'x': 'q', 'y': 1}


def test_rechecks_log_changes_once_and_trace(monkeypatch, caplog):
    events = []
    fake = types.ModuleType('chainermn_comm.trace')
    fake.instant = lambda name, cat, args: events.append((name, cat, args))
    monkeypatch.setitem(sys.modules, 'chainermn_comm.trace', fake)
    monkeypatch.setattr(chainermn_comm, 'trace', fake, raising=False)
    monkeypatch.setattr(_schedule, 'RECHECK_FIRST', 12)
    monkeypatch.setattr(_schedule, 'RECHECK_EVERY', 10)
    caplog.set_level(logging.DEBUG, logger='chainermn.tune')
    fast = {'value': 'a'}
    tuner = _tune.Tuner(COMM, 'recheck', [('x', lambda c: _tune._first(c['x'], ('a', 'b')))], {'x': 'a'})
    tuner.record(0.0)
    for call in range(40):
        if call == 8:
            fast['value'] = 'b'  # the link changed: 'b' is faster from now on
        cfg = tuner.config()
        tuner.record(1.0 if cfg['x'] == fast['value'] else 1.1)  # within DROP: SAMPLES rounds each
    ends = [h[0] for h in tuner.history]
    assert _tune.SAMPLES == 3
    assert ends == [7, 18, 34], ends  # 1 + 3 x 2 calls; then from call 12, and 10 after the last end
    assert [h[2]['x'] for h in tuner.history] == ['a', 'b', 'b']
    logged = [r.getMessage() for r in caplog.records if r.name == 'chainermn.tune' and r.levelno == logging.DEBUG]
    said = [r.getMessage() for r in caplog.records if r.name == 'chainermn.tune' and r.levelno == logging.INFO]
    if COMM.Get_rank() == 0:   # one readable line per decision; the table at debug level
        assert said == ['recheck: x a', 'recheck (changed): x b'], said
        assert len(logged) == 2 and 'x=a' in logged[0] and 'x=b' in logged[1], logged
        assert 'next check at call 12' in logged[0]
    else:
        assert logged == []
    assert [e[0] for e in events] == ['tune'] * 3 and [e[2]['changed'] for e in events] == [False, True, False]
    assert events[1][2]['choice'] == {'x': 'b'} and set(events[1][2]['ms']['x']) == {'a', 'b'}


def test_a_schedule_ends_within_its_bound_and_never_times_a_loser_twice():
    # Five axes of three values each would take 1 + 5 x 3 x SAMPLES calls; the bound is MAX_CALLS,
    # the current choice is not timed again on the next axis, and a value more than DROP_FIRST x
    # the best call seen so far is timed once.  Random times, the same on every rank.
    assert _tune.MAX_CALLS == 10 and _tune.DROP_FIRST == 2.0
    axes = [(name, lambda c, n=name: _tune._first(c[n], (0, 1, 2))) for name in 'abcde']
    for seed in range(40):
        rng = numpy.random.RandomState(seed)
        cost = {(name, v): rng.choice([0.0, 0.05, 0.3, 1.5, 4.0]) for name in 'abcde' for v in range(3)}
        tuner = _tune.Tuner(COMM, 'bound', axes, {n: 0 for n in 'abcde'})
        timed = []

        def seconds(cfg):
            timed.append(tuple(sorted(cfg.items())))
            return 1.0 + sum(cost[(n, v)] for n, v in cfg.items()) + 0.01 * rng.random_sample()
        calls = _run(tuner, seconds)
        assert calls <= _tune.MAX_CALLS and tuner.history[0][0] == calls, (seed, calls)
        best = numpy.inf
        for i, cfg in enumerate(timed):
            t = 1.0 + sum(cost[kv] for kv in cfg)
            if t > 2.0 * best + 0.02:
                assert cfg not in timed[i + 1:], (seed, cfg)  # never timed again
            best = min(best, t)
        assert COMM.allgather(tuner.choice) == [tuner.choice] * COMM.Get_size()


def test_the_current_choice_is_not_timed_again_and_axes_without_calls_left_keep_theirs(caplog):
    caplog.set_level(logging.DEBUG, logger='chainermn.tune')
    axes = [(name, lambda c, n=name: _tune._first(c[n], ('p', 'q', 'r'))) for name in 'abcdef']
    tuner = _tune.Tuner(COMM, 'skip', axes, {n: 'p' for n in 'abcdef'})
    timed = []
    calls = _run(tuner, lambda cfg: timed.append(dict(cfg)) or 1.0)  # all equal: one round each
    # Warm-up + 3 (axis a) + 2 each for b, c, d (their 'p' is the configuration timed already);
    # e and f would need 2 more each: no calls left, they keep 'p'.
    assert calls == 10 and len(timed) == 9 and timed.count({n: 'p' for n in 'abcdef'}) == 1
    assert sorted(tuner.history[0][1]) == ['a', 'b', 'c', 'd'] and tuner.choice == {n: 'p' for n in 'abcdef'}
    logged = [r.getMessage() for r in caplog.records if r.name == 'chainermn.tune' and r.levelno == logging.DEBUG]
    if COMM.Get_rank() == 0:
        assert len(logged) == 1 and '(10 calls)' in logged[0] and 'no calls left for: e, f' in logged[0]


def test_ranks_that_would_tune_different_values_all_raise():
    values = ('a', 'b') if COMM.Get_rank() == 0 else ('a', 'c')
    tuner = _tune.Tuner(COMM, 'test', [('x', lambda c: values)], {'x': 'a'})
    if COMM.Get_size() == 1:
        tuner.record(0.0)
        return
    with pytest.raises(CommunicationError, match='tune x of test over different values'):
        tuner.record(0.0)


def _link(seed, shapes=((300, 200), (50,), (1000, 70))):
    import chainer
    rng = numpy.random.RandomState(seed)
    link = chainer.Link()
    with link.init_scope():
        for i, s in enumerate(shapes):
            setattr(link, 'p{}'.format(i), chainer.Parameter(rng.standard_normal(s).astype(numpy.float32)))
    for _, p in link.namedparams():
        p.grad = rng.standard_normal(p.shape).astype(numpy.float32)
    return link


@pytest.mark.parametrize('tune', ['1', '0'])
def test_auto_over_mpi_messages_averages_and_decides(monkeypatch, tune):
    monkeypatch.setenv('CHAINERMN_SHM_REDUCE', '0')  # a wire to choose even on one host
    monkeypatch.setenv('CHAINERMN_TUNE', tune)
    comm = chainermn_comm.create_communicator('naive', allreduce_grad_dtype='auto')
    assert comm.allreduce_grad_dtype == 'auto'
    size = comm.size
    for call in range(30):
        link = _link(comm.rank * 100 + call)
        per_rank = [[p.grad.copy() for _, p in sorted(_link(r * 100 + call).namedparams())] for r in range(size)]
        comm.multi_node_mean_grad(link)
        for i, (_, p) in enumerate(sorted(link.namedparams())):
            exact = sum(g[i].astype(numpy.float64) for g in per_rank) / size
            top = max(float(numpy.abs(g[i]).max()) for g in per_rank)
            numpy.testing.assert_allclose(p.grad, exact, rtol=0, atol=top * 2.0 ** -6)
    tuned = comm._tuned
    if size == 1:
        assert tuned.tuning.tuner is None  # one rank: nothing to tune
        return
    history = tuned.tuning.tuner.history
    # float32 and the one 16-bit wire whose casts the ranks measured as cheaper
    tried = sorted(history[0][1]['dtype'])
    assert tried in (['bfloat16', 'float32'], ['float16', 'float32']), tried
    knobs = set(history[0][1]) - {'dtype'}
    # The MPI chunk is tuned with two ranks, or for a lossy wire; shared memory is off (pinned).
    if tune == '0':
        assert knobs == set()
    elif size == 2 or tuned.dtype is not None:
        assert knobs == {'chunk'}
    assert COMM.allgather(_tune.label(tuned.dtype)) == [_tune.label(tuned.dtype)] * size


def test_pinned_knobs_are_not_tuned(monkeypatch):
    monkeypatch.setenv('CHAINERMN_SHM_REDUCE', '0')
    monkeypatch.setenv('CHAINERMN_CHUNK_BYTES', str(1 << 20))
    comm = chainermn_comm.create_communicator('naive')
    for call in range(4):
        comm.multi_node_mean_grad(_link(comm.rank + call))
    if comm.size > 1:
        tuner = comm._tuned.tuning.tuner
        assert tuner.history == [(1, {}, {'dtype': None})]  # nothing left to tune
        assert comm._reducer.chunked.chunk_bytes == 1 << 20


def test_grad_dtype_arguments():
    assert chainermn_comm.create_communicator('naive', allreduce_grad_dtype='bfloat16').allreduce_grad_dtype == 'bfloat16'
    assert chainermn_comm.create_communicator('naive', allreduce_grad_dtype='AUTO').allreduce_grad_dtype == 'auto'
    with pytest.raises(ValueError, match="'bfloat16'.*'auto'"):
        chainermn_comm.create_communicator('naive', allreduce_grad_dtype='bf16')


def test_each_set_of_gradients_has_its_own_schedule(monkeypatch):
    monkeypatch.setenv('CHAINERMN_SHM_REDUCE', '0')
    comm = chainermn_comm.create_communicator('naive')
    small, big = _link(comm.rank, ((40, 30),)), _link(comm.rank, ((300, 200), (7,)))
    for call in range(24):
        comm.multi_node_mean_grad(small if call % 2 else big)
    if comm.size == 1:
        return
    tunings = comm._tuned._by_sizes
    assert sorted(tunings) == [(1, 1200), (2, 60007)]
    for sizes, tuning in tunings.items():
        assert tuning.tuner.calls == 12 and tuning.tuner.history, sizes


@pytest.mark.parametrize('f16_share', [0.5, 0.9, 2.0])
def test_auto_tries_one_16bit_wire_on_the_host_the_same_on_every_rank(monkeypatch, f16_share):
    # float16's casts cost f16_share of bfloat16's on the last rank, 3x on the others (the sum decides)
    last = COMM.rank == COMM.size - 1
    share = f16_share if last else 3.0
    monkeypatch.setattr(_tune, '_cast_seconds',
                        lambda codec, x: share if codec is _tune._codecs.FLOAT16 else 1.0)
    wires = _tune.host_wire_choices(COMM)
    total = (3.0 * (COMM.size - 1) + f16_share) / COMM.size  # float16's mean share
    expect = numpy.dtype(numpy.float16) if total < 0.8 else 'bfloat16'
    assert wires == (None, expect)
    assert COMM.allgather(str(wires)) == [str(wires)] * COMM.size


def test_the_cast_sample_times_both_codecs():
    x = numpy.linspace(-1, 1, 1 << 10, dtype=numpy.float32)
    for codec in (_tune._codecs.FLOAT16, _tune._codecs.BFLOAT16):
        assert 0 < _tune._cast_seconds(codec, x) < 1.0


def test_a_leader_change_in_the_last_round_still_leaves_calls_for_the_later_axes():
    # 'end' leads the first two rounds (the next axis then has no values); 'x' would win a third,
    # and then its next axis needs two first calls: a round is only run when they stay free
    # whichever value wins it.
    axes = [('mode', lambda c: ('end', 'x', 'y')),
            ('bucket', lambda c: () if c.get('mode', 'end') == 'end' else (1, 2, 3)),
            ('chunk', lambda c: (10, 20))]
    tuner = _schedule.Tuner(COMM, 'test', axes, {'mode': 'end', 'bucket': 1, 'chunk': 10})
    seen = {}

    def seconds_of(cfg):
        k = seen[cfg['mode']] = seen.get(cfg['mode'], 0) + 1
        if cfg['mode'] == 'x':
            return {1: 1.5, 2: 1.2}.get(k, 0.5)
        return {'end': 1.0, 'y': 1.9}[cfg['mode']]
    calls = _run(tuner, seconds_of)
    assert calls <= _schedule.MAX_CALLS
    figures = tuner.history[0][1]
    assert ('bucket' in figures) == (tuner.choice['mode'] != 'end'), tuner.history[0]
    assert 'chunk' in figures
