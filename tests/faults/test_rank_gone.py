"""Nobody waits for a rank that has left (issue 41): real jobs with no ``CHAINERMN_*`` variable set.

A rank that returns, exits or raises while the others make one more collective call ends the
job within 15 s, with a non-zero status and one line naming the rank, its host and why; a
killed rank ends it at once (the launcher names the process); a frozen rank (SIGSTOP) ends it
once it has not answered the stall inspector for ``CHAINERMN_UNRESPONSIVE_SECONDS`` (shortened
here through the variables, the case being about them); a rank that is only slow is never
ended by that rule; a job that ends normally on every rank exits 0 and prints nothing.  Times
are measured from the fault (the job's ``FAULT-LEAVE-AT`` stamp, or the signal) to the moment
the launcher returned, and printed in the run's summary (tests/faults/conftest.py).
"""

import os
import re
import signal
import time

import pytest

from chainermn_comm.guard.side_channel import ANSWER_WAIT
from chainermn_comm.protocol import RANK_GONE_EXIT_STATUS, VARIABLES
from chainermn_comm.testing import run_mpi

HERE = os.path.dirname(os.path.abspath(__file__))
JOB = os.path.join(HERE, 'jobs', 'job_leave.py')
#: The bound for a rank that left.
LEFT_BOUND_S = 15.0
#: No CHAINERMN_* variable: run_mpi would set CHAINERMN_TIMEOUT; None removes it.
DEFAULTS = {name: None for name in VARIABLES}


def report(res):
    return 'status {} after {:.1f}s{}\n--- stdout ---\n{}\n--- stderr ---\n{}'.format(
        res.returncode, res.seconds, ' (TIMED OUT)' if res.timed_out else '',
        res.stdout[-4000:], res.stderr[-8000:])


def stamp(text):
    m = re.search(r'FAULT-LEAVE-AT=([0-9.]+)', text)
    assert m, 'the job did not print FAULT-LEAVE-AT'
    return float(m.group(1))


def leave(mode, n, env=None, timeout=90, **kwargs):
    res = run_mpi([JOB, mode] + list(kwargs.pop('args', ())), n, timeout=timeout,
                  env=dict(DEFAULTS, **(env or {})), **kwargs)
    return res, time.time()


GONE_LINE = (r'chainermn: rank {last} \(host [^)]+\) {why} at collective call #3; rank 0 \(host [^)]+\) '
             r'waits in collective call #4 allreduce\(shape=\(8,\), dtype=<f4, op=sum\), which rank '
             r'{last} will never join: ending the job with MPI_Abort\({status}\)')

CASES = {
    'return': ('ended \\(its program returned\\)', RANK_GONE_EXIT_STATUS),
    'exit3': ('exited with status 3', 3),
    'raise': (r'exited with status 1 \(uncaught RuntimeError: injected failure on rank \d\)', 1),
    'finalize': (r'called finalize\(\)', RANK_GONE_EXIT_STATUS),
}


@pytest.mark.parametrize('n', [2, 3])
@pytest.mark.parametrize('mode', sorted(CASES))
def test_a_rank_that_leaves_ends_the_job(mode, n, record_exit):
    res, end = leave(mode, n)
    why, status = CASES[mode]
    assert not res.timed_out, report(res)
    assert res.returncode == status, report(res)
    assert 'job ran to the end' not in res.stdout, report(res)
    lines = re.findall(GONE_LINE.format(last=n - 1, why=why, status=status), res.stderr)
    assert len(lines) == 1, report(res)          # one line, from the lowest waiting rank
    assert 'chainermn watchdog' not in res.stderr and 'stall inspector' not in res.stderr, report(res)
    after = end - stamp(res.stderr)
    record_exit('41. rank {} {} (n={})'.format(n - 1, mode, n), after, 'after it left; status {}'.format(
        res.returncode))
    assert after < LEFT_BOUND_S, report(res)


@pytest.mark.parametrize('n', [2, 3])
def test_sys_exit_with_the_hook_aborts_with_its_status(n, record_exit):
    res, end = leave('exit3_hook', n)
    assert not res.timed_out, report(res)
    assert res.returncode == 3, report(res)
    assert re.search(r'sys\.exit\(3\) on rank {}; calling MPI_Abort\(3\) to stop all '
                     r'ranks'.format(n - 1), res.stderr), report(res)
    assert 'job ran to the end' not in res.stdout, report(res)
    after = end - stamp(res.stderr)
    record_exit('41. rank {} sys.exit(3) with the hook (n={})'.format(n - 1, n), after, 'after it left')
    assert after < LEFT_BOUND_S, report(res)


def test_a_rank_that_leaves_ends_a_point_to_point_wait(record_exit):
    res, end = leave('recv', 3)
    assert not res.timed_out and res.returncode == RANK_GONE_EXIT_STATUS, report(res)
    assert re.search(r'chainermn: rank 2 \(host [^)]+\) ended \(its program returned\) at collective '
                     r'call #3; rank 0 \(host [^)]+\) waits in call #4 recv\(\) \[source=2, tag=3\], '
                     r'which rank 2 will never join', res.stderr), report(res)
    after = end - stamp(res.stderr)
    record_exit('41. rank 2 returns, rank 0 in recv from it (n=3)', after, 'after it left')
    assert after < LEFT_BOUND_S, report(res)


@pytest.mark.parametrize('n', [2, 3])
def test_a_killed_rank_ends_the_job(tmp_path, n, record_exit):
    killed = {}

    def kill_last(proc):
        path = tmp_path / 'pid'
        deadline = time.monotonic() + 60
        while not path.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        if path.exists():
            killed['pid'] = int(path.read_text())
            killed['at'] = time.monotonic()
            os.kill(killed['pid'], signal.SIGKILL)

    res, _ = leave('kill', n, args=[tmp_path], on_start=kill_last)
    end = time.monotonic()
    assert 'at' in killed, report(res)
    assert not res.timed_out and res.returncode != 0, report(res)
    # The launcher ends the job at once and names the signal (Hydra: the PID of a process it
    # cleaned up, not always the killed one); no rank lives long enough to say more.
    assert 'BAD TERMINATION' in res.stdout and 'Killed (signal 9)' in res.stdout, report(res)
    assert 'job ran to the end' not in res.stdout, report(res)
    record_exit('41. rank {} SIGKILLed (n={})'.format(n - 1, n), end - killed['at'],
                'after the kill; status {}'.format(res.returncode))
    assert end - killed['at'] < LEFT_BOUND_S, report(res)


@pytest.mark.parametrize('n', [2, 3])
def test_a_frozen_rank_is_declared_gone(n, record_exit):
    stall, unresponsive = 2, 3
    res, end = leave('stop', n, env={'CHAINERMN_STALL_SECONDS': stall,
                                     'CHAINERMN_UNRESPONSIVE_SECONDS': unresponsive})
    assert not res.timed_out, report(res)
    assert res.returncode == RANK_GONE_EXIT_STATUS, report(res)
    lines = re.findall(r'chainermn: rank {} \(host [^)]+\) has not answered the stall inspector for '
                       r'\d+ s \(\$CHAINERMN_UNRESPONSIVE_SECONDS\): it is frozen, stopped, or holds the '
                       r'Python GIL; [^\n]*rank 0 \(host [^)]+\) waits in collective call #4 '
                       r'allreduce\(shape=\(8,\)[^\n]*ending the job with MPI_Abort\(15\)'.format(n - 1),
                       res.stderr)
    assert len(lines) == 1, report(res)
    # The stall report before it says which rank is silent and what ends such a job.
    assert 'ranks that did not answer within' in res.stderr and 'rank {}'.format(n - 1) in res.stderr
    assert 'if it stays silent for 3 s ($CHAINERMN_UNRESPONSIVE_SECONDS) this job ends' in res.stderr
    after = end - stamp(res.stderr)
    bound = stall + max(ANSWER_WAIT, unresponsive) + 8
    record_exit('41. rank {} frozen, SIGSTOP (n={}, stall {} s, unresponsive {} s)'.format(
        n - 1, n, stall, unresponsive), after, 'after it stopped')
    assert after < bound, report(res)


@pytest.mark.parametrize('n', [2, 3])
def test_a_slow_rank_that_answers_is_never_declared_gone(n, record_exit):
    """Rank 0 computes alone (pure Python) for 4x the unresponsive limit after the stall report."""
    stall, unresponsive, slow = 1, 2, 9
    res, _ = leave('slow', n, args=[slow], env={'CHAINERMN_STALL_SECONDS': stall,
                                                'CHAINERMN_UNRESPONSIVE_SECONDS': unresponsive})
    assert not res.timed_out, report(res)
    assert res.returncode == 0, report(res)
    assert res.stdout.count('job ran to the end') == n, report(res)
    assert 'has not answered' not in res.stderr, report(res)
    # The others reported the stall once each, naming rank 0 as alive and missing.
    assert re.search(r'what to do: rank 0 answered, so it is alive \(pid \d+\)', res.stderr), report(res)
    record_exit('41. rank 0 computes alone {} s (n={}, stall {} s, unresponsive {} s)'.format(
        slow, n, stall, unresponsive), res.seconds, 'from launch; finished, status 0')


@pytest.mark.parametrize('n', [1, 2, 3])
def test_a_normal_end_prints_nothing(n):
    res, _ = leave('normal', n)
    assert not res.timed_out and res.returncode == 0, report(res)
    assert res.stdout == '' and res.stderr == '', report(res)


def test_the_documented_defaults_are_the_code_s():
    """docs/environment.md states the frozen-rank bound; the code's defaults are those numbers."""
    from chainermn_comm.guard.config import GuardConfig
    config = GuardConfig.resolve(2, debug=False, check=True) if not any(
        k.startswith('CHAINERMN_') for k in os.environ) else None
    unresponsive = VARIABLES['CHAINERMN_UNRESPONSIVE_SECONDS'].default
    stall = VARIABLES['CHAINERMN_STALL_SECONDS'].default
    assert unresponsive == 240.0 and stall == 60.0
    assert stall + unresponsive <= 300.0  # "at most 5 minutes" after the others began to wait
    if config is not None:
        assert config.unresponsive_seconds == unresponsive and config.exit_notice
    root = os.path.dirname(os.path.dirname(HERE))
    with open(os.path.join(root, 'docs', 'environment.md')) as f:
        env_doc = f.read()
    row = [line for line in env_doc.splitlines() if line.startswith('| `CHAINERMN_UNRESPONSIVE_SECONDS`')]
    assert row and '(default 240' in row[0] and '5 minutes' in row[0], row
    assert any(line.startswith('| `CHAINERMN_EXIT_NOTICE`') and 'default on' in line
               for line in env_doc.splitlines())


@pytest.mark.parametrize('n', [2, 3])
def test_ranks_that_end_at_different_times_print_nothing(n):
    res, _ = leave('staggered', n, args=[3])
    assert not res.timed_out and res.returncode == 0, report(res)
    assert res.stdout == '' and res.stderr == '', report(res)
