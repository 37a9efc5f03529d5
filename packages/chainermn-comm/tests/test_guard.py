"""Unit tests of the call guard (single process)."""

import os
import time

import pytest
from mpi4py import MPI

from chainermn_comm.guard import CallGuard, agreement, debug_enabled, report, resolve_stall_seconds, resolve_timeout
from chainermn_comm.guard.call import Call


def test_resolve_timeout(monkeypatch):
    monkeypatch.delenv('CHAINERMN_TIMEOUT', raising=False)
    assert resolve_timeout(None) == 1800.0
    assert resolve_timeout(0) == 0.0
    assert resolve_timeout(2.5) == 2.5
    monkeypatch.setenv('CHAINERMN_TIMEOUT', '7')
    assert resolve_timeout(None) == 7.0
    assert resolve_timeout(3) == 3.0        # the argument wins over the environment
    monkeypatch.setenv('CHAINERMN_TIMEOUT', 'soon')
    with pytest.raises(ValueError, match='CHAINERMN_TIMEOUT'):
        resolve_timeout(None)
    for bad in (-1, float('nan'), 1e-9, 0.5):
        with pytest.raises(ValueError, match=r'out of range: give 0 \(the watchdog off\) or at least 1 seconds'):
            resolve_timeout(bad)


@pytest.mark.parametrize('value,expected', [('', False), ('0', False), ('off', False), ('1', True),
                                            ('yes', True), (' TRUE ', True)])
def test_debug_enabled(monkeypatch, value, expected):
    monkeypatch.setenv('CHAINERMN_DEBUG', value)
    assert debug_enabled() is expected


def test_guard_tracks_current_and_last_call():
    g = CallGuard(MPI.COMM_SELF, timeout=0, debug=False)
    with g('allreduce', (('shape', (2,)), ('dtype', '<f4')), peer=3):
        cur = g.current
        assert (cur.name, cur.seq, cur.info, cur.number) == ('allreduce', 1, {'peer': 3}, 1)
        assert cur.start <= time.monotonic()
    assert g.current is None and (g.last.name, g.last.seq) == ('allreduce', 1)
    with g('send', (), collective=False, dest=1):
        pass
    assert (g.seq, g.collective_seq) == (2, 1)
    assert g.describe(g.last) == 'call #2 send() [dest=1]'


def test_exception_inside_call_clears_current():
    g = CallGuard(MPI.COMM_SELF, timeout=0, debug=False)
    with pytest.raises(KeyError):
        with g('bcast', (('root', 0),)):
            raise KeyError('x')
    assert g.current is None


def test_long_values_are_shortened():
    g = CallGuard(MPI.COMM_SELF, timeout=0, debug=False)
    text = g.describe(Call.record('gather', 1, (('shapes', tuple(((i,), '<f4') for i in range(500))),), number=1))
    assert len(text) < 300 and 'chars>' in text
    text = g.describe(Call.record('allreduce_grad', 1, (('params', tuple(((i,), '<f4') for i in range(500))),), number=1))
    assert text == 'call #1 allreduce_grad(params=<500 arrays>)'


def test_first_difference():
    a = ('allreduce_grad', (('params', (('/a', (3,), '<f4'), ('/b', (2,), '<f4'))),), 1, 'h0')
    b = ('allreduce_grad', (('params', (('/a', (3,), '<f4'), ('/b', (2,), '<f8'))),), 1, 'h1')
    assert ("parameter 1 is '/b' with shape (2,) dtype <f4 on rank 0 but '/b' with shape (2,) "
            "dtype <f8 on rank 1") in report.first_difference([a, b])
    c = ('allreduce_grad', (('params', (('/a', (3,), '<f4'),)),), 1, 'h1')
    assert ("params has 2 arrays on rank 0 but 1 on rank 1; rank 0 also has parameter '/b' "
            "with shape (2,) dtype <f4") in report.first_difference([a, c])
    assert report.first_difference([a, ('bcast', (('root', 0),), 1, 'h1')]) == ''


def test_watchdog_fires_on_a_stuck_call(monkeypatch):
    fired = []
    g = CallGuard(MPI.COMM_SELF, timeout=1, debug=False)
    monkeypatch.setattr(g, 'fire', lambda cur, elapsed: fired.append((cur.name, elapsed)))
    with g('recv', (), collective=False, source=0):
        deadline = time.monotonic() + 10
        while not fired and time.monotonic() < deadline:
            time.sleep(0.01)
    assert fired and fired[0][0] == 'recv' and fired[0][1] >= 1


def test_guard_overhead_is_small():
    """The fast path is one tuple and one timestamp: well under 5 microseconds a call."""
    g = CallGuard(MPI.COMM_SELF, timeout=1800, debug=False)
    sig = (('shape', (1,)),)
    n = 20000
    best = float('inf')
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(n):
            with g('allreduce', sig):
                pass
        best = min(best, (time.perf_counter() - t) / n)
    assert best < 5e-6, best


FINGERPRINT = '''
import numpy
from chainermn_comm.reduce import chunked as _grad
from chainermn_comm.guard import agreement
import chainer
p = chainer.Parameter(numpy.ones((2, 3), numpy.float32))
p.grad = numpy.ones((2, 3), numpy.float32)
sig = (('shape', (2, 3)), ('dtype', '<f4'), ('op', 'sum'))
print(hash((agreement.stable_code('allreduce'), agreement.stable_key(sig))),
      hash((agreement.stable_code('allreduce_grad'), _grad.params_key([p], 'grad'))))
'''


def test_fingerprints_do_not_depend_on_the_process():
    """Ranks compare hashes: they must not change with Python's per-process string hash seed."""
    import subprocess
    import sys
    outs = set()
    for seed in ('1', '2', '12345'):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        outs.add(subprocess.run([sys.executable, '-c', FINGERPRINT], env=env, check=True,
                                stdout=subprocess.PIPE, universal_newlines=True).stdout)
    assert len(outs) == 1, outs


def test_invalid_input_signatures_compare_alike():
    a = (('invalid input', 'ValueError: rank 0: bad'),)
    b = (('invalid input', 'ValueError: rank 1: bad'),)
    assert agreement.comparable(a) == agreement.comparable(b)
    assert agreement.comparable((('root', 0),)) == (('root', 0),)


def test_stall_seconds_from_environment(monkeypatch):
    monkeypatch.delenv('CHAINERMN_STALL_SECONDS', raising=False)
    assert resolve_stall_seconds() == 60.0
    monkeypatch.setenv('CHAINERMN_STALL_SECONDS', '0')
    assert resolve_stall_seconds() == 0.0
    monkeypatch.setenv('CHAINERMN_STALL_SECONDS', 'x')
    with pytest.raises(ValueError, match='CHAINERMN_STALL_SECONDS'):
        resolve_stall_seconds()


def test_disagreement_hint_names_the_causes_users_hit():
    everyone = [('bcast_obj', (('root', 0),), 7, 'h0'), ('allgather_obj', (), 7, 'h1')]
    text = report.disagreement_message(1, 'the next collective call', everyone)
    assert text.startswith('rank 1: ranks disagree on the next collective call:\n'
                           '  rank 0: collective call #7: bcast_obj(root=0) on host h0\n'
                           '  rank 1: collective call #7: allgather_obj() on host h1   <- this rank\n'), text
    for cause in ('different batch sizes on different ranks',
                  'an extension registered on one rank only',
                  '`if comm.rank == 0`',
                  'a snapshot loaded on one rank only',
                  'a model built differently on one rank',
                  'a parameter without a gradient on one rank',
                  'one rank running an extra iteration'):
        assert cause in text, (cause, text)


def test_each_call_is_its_own_context_and_calls_nest():
    g = CallGuard(MPI.COMM_SELF, timeout=0, debug=False)
    outer = g('allreduce_obj', (('op', 'sum'),))
    inner = g('bcast', (('root', 0),))
    assert outer is not inner and outer.guard is g
    with outer as a:
        assert a is outer and g.current is outer and outer.seq == 1 and outer.number == 1
        with inner:
            assert g.current is inner and (inner.seq, inner.number) == (2, 2)
        assert g.current is outer and g.last is inner
    assert g.current is None and g.last is outer and outer.guard is None  # a record now
    assert g.describe(outer) == 'call #1 allreduce_obj(op=sum)'


def test_a_checked_call_costs_few_function_calls():
    import sys
    g = CallGuard(MPI.COMM_SELF, timeout=1800, debug=False)
    sig = (('shape', (1,)),)
    with g('allreduce', sig):
        pass
    seen = []

    def profile(frame, event, arg):
        if event == 'call':
            seen.append(frame.f_code.co_name)
    sys.setprofile(profile)
    try:
        with g('allreduce', sig):
            pass
    finally:
        sys.setprofile(None)
    assert seen == ['__call__', '__init__', '__enter__', '__exit__'], seen
