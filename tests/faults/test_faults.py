"""Fault-injection suite: real jobs under mpiexec that must end promptly, loudly and correctly.

Each case asserts how the job ends (status), how fast, and what it printed.  Times are
measured from the launch of mpiexec (``seconds``) or from the injected fault (parsed from the
job's output) to the moment the launcher returned.
"""

import os
import random
import re
import signal
import time

import numpy
import pytest

from chainermn_comm.protocol import WATCHDOG_EXIT_STATUS
from chainermn_comm.testing import run_mpi

HERE = os.path.dirname(os.path.abspath(__file__))
JOBS = os.path.join(HERE, 'jobs')


def job(name):
    return os.path.join(JOBS, name)


def report(res):
    return 'status {} after {:.1f}s{}\n--- stdout ---\n{}\n--- stderr ---\n{}'.format(
        res.returncode, res.seconds, ' (TIMED OUT)' if res.timed_out else '',
        res.stdout[-6000:], res.stderr[-12000:])


def stamp(text, key):
    m = re.search(key + r'=([0-9.]+)', text)
    assert m, 'job did not print {}'.format(key)
    return float(m.group(1))


def wait_for_files(paths, proc, limit=60):
    """Return when every path exists; fail if the launcher exits first or ``limit`` s pass."""
    deadline = time.monotonic() + limit
    while not all(os.path.exists(p) for p in paths):
        if proc.poll() is not None:
            return False
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


# -- 1. uncaught exception with the hook on ---------------------------------------------------
@pytest.mark.parametrize('n', [2, 3])
def test_exception_on_one_rank_ends_job(n, record_exit):
    rng = random.Random()
    fail_rank, fail_at = rng.randrange(n), rng.randrange(1, 200)
    res = run_mpi([job('job_exception.py'), fail_rank, fail_at], n, timeout=60,
                  env={'CHAINERMN_FORCE_ABORT_ON_EXCEPTION': '1', 'CHAINERMN_TIMEOUT': '50'})
    end = time.time()
    assert not res.timed_out, report(res)
    assert res.returncode != 0, report(res)
    assert 'injected failure on rank {} at iteration {}'.format(fail_rank, fail_at) in res.stderr, report(res)
    assert 'uncaught RuntimeError on rank {}'.format(fail_rank) in res.stderr, report(res)
    after = end - stamp(res.stderr, 'FAULT-RAISED-AT')
    record_exit('1. exception (n={}, rank {}, it {})'.format(n, fail_rank, fail_at), after,
                'after the raise; {:.2f} s from launch'.format(res.seconds))
    assert after < 10, report(res)


# -- 2. SIGKILL mid all-reduce ---------------------------------------------------------------------
def test_sigkill_mid_allreduce_ends_job(tmp_path, record_exit):
    timeout_s = 5
    killed = {}

    def kill_rank_1(proc):
        if wait_for_files([str(tmp_path / 'pid.1')], proc):
            pid = int((tmp_path / 'pid.1').read_text())
            killed['at'] = time.monotonic()
            os.kill(pid, signal.SIGKILL)

    res = run_mpi([job('job_kill.py'), tmp_path], 2, timeout=60, on_start=kill_rank_1,
                  env={'CHAINERMN_TIMEOUT': timeout_s})
    end = time.monotonic()
    assert 'at' in killed, report(res)
    assert not res.timed_out, report(res)
    assert res.returncode != 0, report(res)
    assert 'job ran to the end' not in res.stdout, report(res)
    after = end - killed['at']
    record_exit('2. SIGKILL rank 1 mid all-reduce (n=2)', after,
                'after the kill (status {}, watchdog timeout {} s)'.format(res.returncode, timeout_s))
    assert after < timeout_s + 10, report(res)


# -- 3. one rank skips a collective: the watchdog fires -------------------------------------------
@pytest.mark.parametrize('n', [2, 3])
def test_skipped_collective_fires_watchdog(n, record_exit):
    # Without the exit notice (tests/faults/test_rank_gone.py has it) only the watchdog ends it.
    timeout_s = 3
    res = run_mpi([job('job_skip.py'), 'exit'], n, timeout=60,
                  env={'CHAINERMN_TIMEOUT': timeout_s, 'CHAINERMN_EXIT_NOTICE': '0'})
    end = time.time()
    assert not res.timed_out, report(res)
    assert res.returncode == WATCHDOG_EXIT_STATUS, report(res)
    assert 'job ran to the end' not in res.stdout, report(res)
    # The blocked call is named with its sequence number, shape and dtype, and the stacks follow.
    assert re.search(r'chainermn watchdog: rank \d of {}: call #4 allreduce\(shape=\(5, 7\), dtype=<f4, '
                     r'op=sum\) has been blocked for \d+\.\d s \(timeout 3 s'.format(n), res.stderr), report(res)
    assert 'job_skip.py' in res.stderr and 'Thread 0x' in res.stderr, report(res)
    after = end - stamp(res.stderr, 'FAULT-SKIP-AT')
    record_exit('3. skipped collective (n={}, timeout {} s)'.format(n, timeout_s), after,
                'after the skip')
    assert after < timeout_s + 10, report(res)


@pytest.mark.parametrize('n', [2, 3])
def test_skipped_collective_meets_the_next_one(n, record_exit):
    """The skipping rank's next collective meets the others' call: every rank raises at once."""
    res = run_mpi([job('job_skip.py'), 'next'], n, timeout=60, env={'CHAINERMN_TIMEOUT': '50'})
    end = time.time()
    assert not res.timed_out, report(res)
    assert res.returncode != 0, report(res)
    assert 'job ran to the end' not in res.stdout, report(res)
    assert 'chainermn watchdog' not in res.stderr, report(res)
    # Both ranks raise at the same moment: their tracebacks may interleave on the shared stderr.
    assert 'CommunicationError' in res.stderr, report(res)
    assert_one_report(res, n, 'CommunicationError')
    assert re.search(r'rank {}: collective call #4: bcast_obj\(root=0\)'.format(n - 1), res.stderr), report(res)
    assert re.search(r'rank 0: collective call #4: allreduce\(shape=\(5, 7\), dtype=<f4, op=sum\)',
                     res.stderr), report(res)
    after = end - stamp(res.stderr, 'FAULT-SKIP-AT')
    record_exit('3b. skipped collective, next one meets it (n={})'.format(n), after, 'after the skip')
    assert after < 10, report(res)


def assert_one_report(res, n, error):
    """Every rank raised ``error`` together: rank 0 reports it once, each other rank points at it."""
    assert res.stderr.count('rank 0: ranks disagree on the next collective call') == 1, report(res)
    for r in range(1, n):
        assert 'rank {}: ranks disagree'.format(r) not in res.stderr, report(res)
        assert re.search(r'\[rank {} host [^]]+\] {}, raised by every rank together: rank 0 reports '
                         r'it'.format(r, error), res.stderr), report(res)


# -- 4. mismatched collectives in debug mode -------------------------------------------------------
MISMATCHES = {
    'op': [r'rank 0: collective call #2: allreduce\(shape=\(4, 3\)', r'rank 1: collective call #2: bcast\(root=0\)'],
    'shape': [r'First difference: shape is \(4, 3\) on rank 0 but \(2, 3\) on rank 1'],
    'dtype': [r'First difference: dtype is <f4 on rank 0 but <f8 on rank 1'],
    'nograd': [r'First difference: params has 2 arrays on rank 0 but 1 on rank 1', r'zero_fill=True'],
    'extra': [r'rank 0: collective call #5: allreduce', r'rank 1: exiting'],
}


@pytest.mark.parametrize('n', [2, 3])
@pytest.mark.parametrize('mode', sorted(MISMATCHES))
def test_mismatch_raises_on_every_rank(mode, n, record_exit):
    res = run_mpi([job('job_mismatch.py'), mode], n, timeout=60,
                  env={'CHAINERMN_DEBUG': '1', 'CHAINERMN_TIMEOUT': '50'})
    end = time.time()
    assert not res.timed_out, report(res)
    assert res.returncode != 0, report(res)
    assert 'job ran past the mismatch' not in res.stdout, report(res)
    assert 'chainermn watchdog' not in res.stderr, report(res)
    if mode == 'extra':   # the extra rank is leaving (not raising): each side says what it saw
        for r in range(n):
            assert re.search(r'rank {}: ranks disagree on the next collective call'.format(r), res.stderr), \
                'rank {} did not report the mismatch\n{}'.format(r, report(res))
    else:
        assert_one_report(res, n, 'CommunicationError')
    for pattern in MISMATCHES[mode]:
        assert re.search(pattern, res.stderr), 'missing {!r}\n{}'.format(pattern, report(res))
    after = end - stamp(res.stderr, 'FAULT-MISMATCH-AT')
    record_exit('4. debug mismatch {} (n={})'.format(mode, n), after,
                'after the mismatch; {:.2f} s from launch'.format(res.seconds))
    assert after < 10, report(res)


# -- 5 and 6: preemption and checkpoint recovery (need the multi-node checkpointer) -----------------
def _checkpointer_missing():
    try:
        import chainermn_train
        return not hasattr(chainermn_train, 'create_multi_node_checkpointer')
    except ImportError:
        return True


needs_checkpointer = pytest.mark.xfail(
    _checkpointer_missing(), strict=False,
    reason='chainermn_train.create_multi_node_checkpointer is not available yet')

ITERATIONS = 30


def train(workdir, n=2, extra=(), on_start=None, timeout=120):
    return run_mpi([job('job_train.py'), workdir, ITERATIONS] + list(extra), n, timeout=timeout,
                   on_start=on_start, env={'CHAINERMN_TIMEOUT': '60'})


def final_params(workdir):
    with numpy.load(os.path.join(str(workdir), 'final.npz')) as f:
        return {k: f[k].copy() for k in f.files}


def assert_same_params(a, b):
    assert sorted(a) == sorted(b)
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, k
        assert numpy.array_equal(a[k], b[k]), '{} differs:\n{}\n{}'.format(k, a[k], b[k])


@pytest.fixture(scope='module')
def reference_params(tmp_path_factory):
    """Final parameters of an uninterrupted run."""
    if _checkpointer_missing():
        pytest.xfail('chainermn_train.create_multi_node_checkpointer is not available yet')
    workdir = tmp_path_factory.mktemp('reference')
    res = train(workdir)
    assert res.returncode == 0, report(res)
    assert 'FAULT-RESUMED-AT rank=0 iteration=0' in res.stderr, report(res)
    return final_params(workdir)


def _preempt(workdir, n, gate, record_exit=None, case=None, signalled=None):
    """Run to iteration ``gate``, SIGTERM the ``signalled`` ranks (all) there; return the MpiResult."""
    sent = {}
    signalled = list(range(n)) if signalled is None else list(signalled)
    extra = ['--gate', str(gate), '--cp-every', '2', '--gate-ranks', ','.join(map(str, signalled))]

    def sigterm_all(proc):
        pids = [str(workdir / 'pid.{}'.format(r)) for r in signalled]
        if wait_for_files(pids, proc):
            sent['at'] = time.monotonic()
            for p in pids:
                os.kill(int(open(p).read()), signal.SIGTERM)

    res = train(workdir, n, extra, on_start=sigterm_all)
    end = time.monotonic()
    from chainermn_train.preemption import PREEMPTED_EXIT_STATUS
    assert 'at' in sent, report(res)
    assert not res.timed_out, report(res)
    assert res.returncode == PREEMPTED_EXIT_STATUS, report(res)
    for r in range(n):
        why = 'this rank received SIGTERM' if r in signalled else 'another rank received a stop signal'
        assert ('rank {}: preempted ({}); all ranks stop at iteration {}; checkpoint written; exiting with '
                'status {}'.format(r, why, gate, PREEMPTED_EXIT_STATUS)) in res.stderr, report(res)
    assert 'FAULT-TRAIN-DONE' not in res.stdout, report(res)
    if record_exit is not None:
        record_exit(case, end - sent['at'], 'after SIGTERM (checkpoint + exit {})'.format(res.returncode))
    return res


@needs_checkpointer
def test_sigterm_preemption_resumes_without_loss(tmp_path, reference_params, record_exit):
    gate = 13
    _preempt(tmp_path, 2, gate, record_exit, '5. SIGTERM all ranks at it {} (n=2)'.format(gate))
    res = train(tmp_path)
    assert res.returncode == 0, report(res)
    assert 'FAULT-RESUMED-AT rank=0 iteration={}'.format(gate) in res.stderr, report(res)
    assert 'FAULT-RESUMED-AT rank=1 iteration={}'.format(gate) in res.stderr, report(res)
    assert_same_params(final_params(tmp_path), reference_params)


@needs_checkpointer
def test_sigterm_on_one_rank_stops_all_at_the_same_iteration(tmp_path, reference_params, record_exit):
    gate = 7
    _preempt(tmp_path, 2, gate, record_exit, '5b. SIGTERM rank 1 only at it {} (n=2)'.format(gate),
             signalled=[1])
    res = train(tmp_path)
    assert res.returncode == 0, report(res)
    assert 'FAULT-RESUMED-AT rank=0 iteration={}'.format(gate) in res.stderr, report(res)
    assert_same_params(final_params(tmp_path), reference_params)


def _generation_file(workdir, rank, iteration):
    path = workdir / 'ckpt' / 'faultrun.{}.{}'.format(rank, iteration)
    assert path.exists(), 'expected checkpoint {} (have: {})'.format(
        path, sorted(os.listdir(str(workdir / 'ckpt'))))
    return path


@needs_checkpointer
def test_truncated_and_corrupt_checkpoints_fall_back(tmp_path, reference_params, record_exit):
    # Generations at iterations 2, 4, ..., 12 (cp every 2 and the preemption save at 12).
    _preempt(tmp_path, 2, 12)
    newest = _generation_file(tmp_path, 1, 12)
    newest.write_bytes(newest.read_bytes()[:max(1, newest.stat().st_size // 2)])      # truncated
    older = _generation_file(tmp_path, 0, 10)
    data = bytearray(older.read_bytes())
    mid = len(data) // 2
    data[mid:mid + 64] = bytes(b ^ 0xFF for b in data[mid:mid + 64])                 # corrupted
    older.write_bytes(bytes(data))
    res = train(tmp_path)
    assert res.returncode == 0, report(res)
    # Rank 1's 12 and rank 0's 10 are unusable: the newest generation complete on both ranks is 8.
    assert 'FAULT-RESUMED-AT rank=0 iteration=8' in res.stderr, report(res)
    assert 'FAULT-RESUMED-AT rank=1 iteration=8' in res.stderr, report(res)
    assert_same_params(final_params(tmp_path), reference_params)
    record_exit('6. truncated+corrupt checkpoint resume (n=2)', res.seconds, 'resumed at 8, from launch')
