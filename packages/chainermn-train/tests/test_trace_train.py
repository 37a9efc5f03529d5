"""Tracing a training loop, and the live straggler line (mpi/trace_train.py under mpiexec)."""

import collections
import json
import os
import re
import socket

import pytest

from chainermn_comm.testing import run_mpi

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, 'mpi', 'trace_train.py')
LINE = re.compile(r'^chainermn: straggler: rank (\d+) \(host (\S+)\) arrives ([0-9.]+) ms after the '
                  r'median at (\d+) of the last (\d+) updates$', re.M)


def _run(tmp_path, n, iters, *args, env=None, timeout=180, trace=True):
    full = dict(env or {})
    if trace:
        full['CHAINERMN_TRACE'] = str(tmp_path / 'trace')
    res = run_mpi([SCRIPT, str(tmp_path / 'out'), iters] + list(args), n, timeout=timeout, env=full)
    report = 'status {} after {:.1f}s{}\n--- stdout ---\n{}\n--- stderr ---\n{}'.format(
        res.returncode, res.seconds, ' (TIMED OUT)' if res.timed_out else '', res.stdout[-6000:],
        res.stderr[-6000:])
    assert not res.timed_out, report
    return res, report


def _load(tmp_path, name='trace.json'):
    with open(str(tmp_path / 'trace' / name)) as f:
        return json.load(f)


@pytest.mark.parametrize('n', [1, 2, 3])
def test_every_category_of_a_training_loop(n, tmp_path):
    iters = 16
    res, report = _run(tmp_path, n, iters)
    assert res.returncode == 0 and res.stdout.count(' done') == n, report
    assert not LINE.search(res.stderr), report  # balanced: nobody is named
    doc = _load(tmp_path)
    events = doc['traceEvents']
    assert sorted(doc['otherData']['ranks']) == [str(r) for r in range(n)]
    assert sorted(e['pid'] for e in events if e['name'] == 'process_name') == list(range(n))
    for rank in range(n):
        mine = [e for e in events if e['pid'] == rank and e['ph'] == 'X']
        count = collections.Counter((e['cat'], e['name']) for e in mine)
        want = {('step', 'update'): iters, ('compute', 'forward'): iters,
                ('compute', 'backward'): iters, ('compute', 'optimizer'): iters,
                ('comm', 'allreduce_grad'): iters, ('data', 'data'): iters - 1,
                ('eval', 'evaluate'): iters // 5, ('io', 'checkpoint save'): iters // 4,
                ('io', 'checkpoint load'): 1, ('io', 'snapshot'): iters // 6 if rank < 2 else 0,
                ('io', 'snapshot load'): 1}
        for key, value in want.items():
            assert count[key] == value, (rank, key, count)
        cats = {e['cat'] for e in mine}
        assert cats == {'step', 'compute', 'comm', 'data', 'io', 'eval'} | ({'wait'} if n > 1 else set())
        steps = [e for e in mine if e['cat'] == 'step']
        assert [e['args']['iteration'] for e in steps] == list(range(1, iters + 1))
        assert all(e['tid'] == 0 for e in mine)  # all on the main thread
        for e in mine:
            if e['name'] == 'allreduce_grad':
                assert e['args']['grad'] is True and e['args']['op'] == 'mean'
                assert e['args']['bytes'] == 8 * (4 * 5 + 5 + 5 * 3 + 3)  # the MLP's float64 grads
                assert e['args']['dtype'] == 'float64'
        # Phases of an update lie inside it; data lies between updates.
        for step, nxt in zip(steps, steps[1:]):
            inside = [e for e in mine if e['cat'] == 'compute' and step['ts'] <= e['ts'] <=
                      step['ts'] + step['dur']]
            assert [e['name'] for e in inside] == ['forward', 'backward', 'optimizer']
            data = [e for e in mine if e['cat'] == 'data' and e['ts'] >= step["ts"] + step["dur"] - 1
                    and e["ts"] + e["dur"] <= nxt["ts"] + 1]
            assert len(data) == 1


@pytest.mark.parametrize('how,track', [('--overlap', 'overlap'), ('--double', 'double_buffering')])
def test_background_averages_are_grad_events_on_their_own_track(how, track, tmp_path):
    res, report = _run(tmp_path, 2, 12, how, env={'CHAINERMN_OVERLAP_MODE': 'thread'})
    assert res.returncode == 0, report
    events = _load(tmp_path)['traceEvents']
    for rank in range(2):
        tracks = {e['tid']: e['args']['name'] for e in events
                  if e['pid'] == rank and e['name'] == 'thread_name'}
        assert sorted(tracks.values()) == sorted(['main', track]), tracks
        tid = [t for t, name in tracks.items() if name == track][0]
        grads = [e for e in events if e['pid'] == rank and e.get('args', {}).get('grad')]
        assert all(e['cat'] == 'comm' for e in grads)
        inline = [e for e in grads if e['tid'] == 0]  # double buffering averages the 1st inline
        assert len(inline) == (0 if how == '--overlap' else 1), grads
        assert [e['tid'] for e in grads if e['tid'] != 0] == [tid] * (12 - len(inline)), grads
        if how == '--overlap':
            assert {e['name'] for e in grads} == {'bucket 0'}


@pytest.mark.parametrize('n', [2, 3])
def test_a_slow_rank_is_named_once(n, tmp_path):
    res, report = _run(tmp_path, n, 40, '--slow-rank', '1', '--sleep', '0.03')
    assert res.returncode == 0, report
    found = LINE.findall(res.stderr)
    assert len(found) == 1, report
    rank, host, late, count, window = found[0]
    assert rank == '1' and host == socket.gethostname(), report
    assert float(late) >= (15 if n == 2 else 25) and 26 <= int(count) <= int(window) <= 50, report
    named = [e for e in _load(tmp_path)['traceEvents'] if e['name'] == 'straggler']
    assert len(named) == 1 and named[0]['pid'] == 0 and named[0]['ph'] == 'i', named
    assert named[0]['args']['rank'] == 1 and named[0]['args']['count'] == int(count)


def test_detection_off_names_nobody(tmp_path):
    res, report = _run(tmp_path, 2, 40, '--slow-rank', '1', '--sleep', '0.03', trace=False,
                       env={'CHAINERMN_STRAGGLER': '0'})
    assert res.returncode == 0 and not LINE.search(res.stderr), report
    assert not (tmp_path / 'trace').exists()


def test_an_exception_writes_the_trace_before_the_abort(tmp_path):
    res, report = _run(tmp_path, 3, 20, '--raise-at', '7')
    assert res.returncode != 0 and 'planned failure' in res.stderr, report
    doc = _load(tmp_path)
    assert doc['otherData']['ranks']['1']['reason'] == 'exception', doc['otherData']
    part = _load(tmp_path, 'trace.rank1.json')
    assert part['reason'] == 'exception'
    assert max(e['args']['iteration'] for e in part['traceEvents'] if e.get('cat') == 'step') == 7


@pytest.mark.parametrize('preempt', [True, False])
def test_sigterm_writes_the_trace(preempt, tmp_path):
    args = ['--sigterm-at', '5'] + ([] if preempt else ['--no-preemption'])
    res, report = _run(tmp_path, 2, 30, *args)
    doc = _load(tmp_path)
    if preempt:  # every rank stops at the same iteration, writes its part, the last one merges
        assert res.returncode == 75, report
        assert {r: v['reason'] for r, v in doc['otherData']['ranks'].items()} == {
            '0': 'sigterm', '1': 'sigterm'}
    else:  # rank 0 dies of the signal after writing its part
        assert res.returncode != 0, report
        assert doc['otherData']['ranks']['0']['reason'] == 'sigterm', doc['otherData']
        part = _load(tmp_path, 'trace.rank0.json')
        assert max(e['args']['iteration'] for e in part['traceEvents'] if e.get('cat') == 'step') == 5


def test_phases_of_a_model_on_a_gpu_are_timed_with_cuda_events(tmp_path):
    """On the NumPy stand-in for CuPy: forward/backward/optimizer come from CUDA event pairs."""
    fake = os.path.join(HERE, '..', '..', 'chainermn-comm', 'tests', 'fakecupy')
    if not os.path.isdir(fake):
        pytest.skip('the stand-in for CuPy lives in the monorepo checkout')
    path = os.pathsep.join([os.path.abspath(fake)] + [
        p for p in os.environ.get('PYTHONPATH', '').split(os.pathsep) if p])
    res, report = _run(tmp_path, 1, 8, '--device-timed', env={'PYTHONPATH': path})
    assert res.returncode == 0, report
    events = _load(tmp_path)['traceEvents']
    phases = [e for e in events if e.get('cat') == 'compute']
    assert collections.Counter(e['name'] for e in phases) == {'forward': 8, 'backward': 8,
                                                              'optimizer': 8}
    assert all(e['args'] == {'device': True} for e in phases), phases[:3]
    steps = [e for e in events if e.get('cat') == 'step']
    for e in phases:  # on the host clock, inside their update
        assert any(s['ts'] - 1 <= e['ts'] and e['ts'] + e['dur'] <= s['ts'] + s['dur'] + 1
                   for s in steps), e
