"""Nobody waits for a rank that has left, across nodes (issue 41): 2 nodes of namespaces, no ``CHAINERMN_*`` set.

The same job as tests/faults/test_rank_gone.py; the leaving rank is the last one, on node1, and
the rank that ends the job is rank 0, on node0: the notice crosses the link.  Times are from the
fault to the launcher's return and printed in the run's summary.
"""

import os
import re
import signal
import time

import pytest

from chainermn_comm.protocol import RANK_GONE_EXIT_STATUS, VARIABLES

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
JOB = os.path.join(ROOT, 'tests', 'faults', 'jobs', 'job_leave.py')
LEFT_BOUND_S = 15.0
DEFAULTS = {name: None for name in VARIABLES if name != 'CHAINERMN_NODE_LOCAL'}


@pytest.fixture(scope='module')
def nodes2(require_cluster):
    """One 2-node cluster for every case here (each case is one job on it)."""
    from chainermn_tools.cluster import Cluster
    cluster = Cluster(nodes=2).start()
    yield cluster
    cluster.close()


def report(res):
    return 'status {} after {:.1f}s{}\n--- stdout ---\n{}\n--- stderr ---\n{}'.format(
        res.returncode, res.seconds, ' (TIMED OUT)' if res.timed_out else '',
        res.stdout[-4000:], res.stderr[-8000:])


def run(cluster, mode, ranks_per_node=1, env=None, args=(), on_start=None):
    res = cluster.mpiexec([JOB, mode] + [str(a) for a in args], ranks_per_node=ranks_per_node,
                          timeout=120, env=dict(DEFAULTS, **(env or {})), on_start=on_start)
    return res, time.time()


def since_leave(res, end):
    m = re.search(r'FAULT-LEAVE-AT=([0-9.]+)', res.stderr)
    assert m, report(res)
    return end - float(m.group(1))


CASES = [('return', 1, r'ended \(its program returned\)', RANK_GONE_EXIT_STATUS),
         ('return', 2, r'ended \(its program returned\)', RANK_GONE_EXIT_STATUS),
         ('exit3', 1, 'exited with status 3', 3),
         ('raise', 1, r'exited with status 1 \(uncaught RuntimeError: injected failure on rank 1\)', 1)]


@pytest.mark.parametrize('mode,per_node,why,status', CASES)
def test_a_rank_that_leaves_on_the_other_node_ends_the_job(nodes2, mode, per_node, why, status,
                                                           record_figure):
    res, end = run(nodes2, mode, per_node)
    last = 2 * per_node - 1
    assert not res.timed_out and res.returncode == status, report(res)
    assert 'job ran to the end' not in res.stdout, report(res)
    lines = re.findall(r'chainermn: rank {} \(host node1\) {} at collective call #3; rank 0 \(host node0\) '
                       r'waits in collective call #4 allreduce\(shape=\(8,\), dtype=<f4, op=sum\), which '
                       r'rank {} will never join: ending the job with MPI_Abort\({}\)'.format(
                           last, why, last, status), res.stderr)
    assert len(lines) == 1, report(res)
    after = since_leave(res, end)
    record_figure('41. rank {} on node1 {} (2x{})'.format(last, mode, per_node), after,
                  's after it left; status {}'.format(res.returncode))
    assert after < LEFT_BOUND_S, report(res)


def test_sys_exit_with_the_hook_on_the_other_node(nodes2, record_figure):
    res, end = run(nodes2, 'exit3_hook')
    assert not res.timed_out and res.returncode == 3, report(res)
    assert 'sys.exit(3) on rank 1; calling MPI_Abort(3)' in res.stderr, report(res)
    after = since_leave(res, end)
    record_figure('41. rank 1 on node1 sys.exit(3), hook (2x1)', after, 's after it left')
    assert after < LEFT_BOUND_S, report(res)


def test_a_killed_rank_on_the_other_node(nodes2, tmp_path, record_figure):
    seen = {}

    def kill_rank_1(proc):
        path = tmp_path / 'pid'
        deadline = time.monotonic() + 60
        while not path.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        if path.exists():
            seen['at'] = time.monotonic()
            seen['pids'] = nodes2.kill(1, signal.SIGKILL, ranks_only=True)

    res, _ = run(nodes2, 'kill', args=[tmp_path], on_start=kill_rank_1)
    end = time.monotonic()
    assert 'at' in seen and seen['pids'], report(res)
    assert not res.timed_out and res.returncode != 0, report(res)
    assert 'job ran to the end' not in res.stdout, report(res)
    record_figure('41. rank 1 on node1 SIGKILLed (2x1)', end - seen['at'],
                  's after the kill; status {}'.format(res.returncode))
    assert end - seen['at'] < LEFT_BOUND_S, report(res)


def test_a_frozen_rank_on_the_other_node(nodes2, record_figure):
    stall, unresponsive = 2, 3
    res, end = run(nodes2, 'stop', env={'CHAINERMN_STALL_SECONDS': stall,
                                        'CHAINERMN_UNRESPONSIVE_SECONDS': unresponsive})
    assert not res.timed_out and res.returncode == RANK_GONE_EXIT_STATUS, report(res)
    assert len(re.findall(r'chainermn: rank 1 \(host node1\) has not answered the stall inspector for \d+ s '
                          r'[^\n]*rank 0 \(host node0\) waits in collective call #4', res.stderr)) == 1, \
        report(res)
    after = since_leave(res, end)
    record_figure('41. rank 1 on node1 frozen (2x1, stall 2 s, unresponsive 3 s)', after,
                  's after it stopped')
    assert after < stall + 5 + unresponsive + 8, report(res)


def test_a_slow_rank_on_the_other_node_is_not_declared_gone(nodes2, record_figure):
    res, _ = run(nodes2, 'slow', args=[6], env={'CHAINERMN_STALL_SECONDS': 1,
                                                'CHAINERMN_UNRESPONSIVE_SECONDS': 2})
    assert not res.timed_out and res.returncode == 0, report(res)
    assert res.stdout.count('job ran to the end') == 2 and 'has not answered' not in res.stderr, report(res)
    record_figure('41. rank 0 computes alone 6 s (2x1, stall 1 s, unresponsive 2 s)', res.seconds,
                  's from launch; finished, status 0')


def test_a_normal_end_on_two_nodes_prints_nothing(nodes2):
    res, _ = run(nodes2, 'normal', 2)
    assert not res.timed_out and res.returncode == 0, report(res)
    assert res.stdout == '' and res.stderr == '', report(res)


def test_ranks_that_end_at_different_times_on_two_nodes_print_nothing(nodes2):
    """Rank 0 ends 3 s after the others: it sends them no notice (they told it), nothing is left over."""
    res, _ = run(nodes2, 'staggered', 2, args=[3])
    assert not res.timed_out and res.returncode == 0, report(res)
    assert res.stdout == '' and res.stderr == '', report(res)
