"""Faults across nodes (issue 15, test 7a and 7b): a whole node dies, a node's link goes down.

Times are measured from the injected fault to the moment the job was over (launcher returned and
no rank left), and printed in the run's summary.
"""

import os
import re
import time

import pytest

from chainermn_comm.protocol import WATCHDOG_EXIT_STATUS

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FAULT_JOBS = os.path.join(ROOT, 'tests', 'faults', 'jobs')
JOBS = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'jobs')


def report(res):
    return 'status {} after {:.1f}s{}\n--- stdout ---\n{}\n--- stderr ---\n{}'.format(
        res.returncode, res.seconds, ' (TIMED OUT)' if res.timed_out else '',
        res.stdout[-6000:], res.stderr[-12000:])


def wait_for(paths, proc, limit=90):
    """Return True once every path exists; False if the launcher exits first or ``limit`` s pass."""
    deadline = time.monotonic() + limit
    while not all(os.path.exists(p) for p in paths):
        if proc.poll() is not None or time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def ranks_left(cluster, nodes):
    return [p for n in nodes for p in cluster.processes(n) if p[2] != 'hydra_pmi_proxy']


def watch_until_over(cluster, proc, survivors, t0, limit=60):
    """Return seconds from ``t0`` until the launcher exited and no rank is left on ``survivors``."""
    deadline = t0 + limit
    while proc.poll() is None or ranks_left(cluster, survivors):
        if time.monotonic() > deadline:
            return None
        time.sleep(0.01)
    return time.monotonic() - t0


# -- 7a. every process of one node killed mid all-reduce --------------------------------------------
def test_node_killed_mid_allreduce_ends_job(cluster2, tmp_path, record_figure):
    seen = {}

    def kill_node1(proc):
        # 2 nodes x 2 ranks: rank 1 (node0) marks iteration 20 of the all-reduce loop.
        if wait_for([str(tmp_path / 'pid.1')], proc):
            seen['t0'] = time.monotonic()
            seen['killed'] = cluster2.kill(1)
            seen['over'] = watch_until_over(cluster2, proc, [0], seen['t0'])

    res = cluster2.mpiexec([os.path.join(FAULT_JOBS, 'job_kill.py'), tmp_path], ranks_per_node=2,
                           timeout=120, on_start=kill_node1, env={'CHAINERMN_TIMEOUT': '50'})
    assert 't0' in seen, report(res)
    assert len(seen['killed']) >= 3, seen          # its proxy and both ranks
    assert not res.timed_out and res.returncode != 0, report(res)
    assert 'job ran to the end' not in res.stdout, report(res)
    assert seen['over'] is not None, 'ranks of node0 still running 60 s after node1 died\n' + report(res)
    record_figure('7a. node1 SIGKILLed mid all-reduce (2x2)', seen['over'],
                  's to exit: launcher status {}, node0 ranks gone'.format(res.returncode))
    assert seen['over'] < 30, report(res)


# -- 7b. one node's link down mid-training: the watchdog on the other node fires --------------------
def test_link_down_fires_watchdog_on_other_node(cluster2, tmp_path, record_figure):
    timeout_s = 5
    seen = {}

    def cut_node1(proc):
        if wait_for([str(tmp_path / 'ready.{}'.format(r)) for r in range(2)], proc):
            seen['t0'] = time.monotonic()
            cluster2.link_down(1)
            seen['over'] = watch_until_over(cluster2, proc, [0], seen['t0'])

    try:
        res = cluster2.mpiexec([os.path.join(JOBS, 'job_loop.py'), tmp_path], ranks_per_node=1, timeout=120,
                               on_start=cut_node1, env={'CHAINERMN_TIMEOUT': timeout_s})
    finally:
        cluster2.link_up(1)
    assert 't0' in seen, report(res)
    assert not res.timed_out, report(res)
    assert res.returncode == WATCHDOG_EXIT_STATUS, report(res)
    assert 'job ran to the end' not in res.stdout, report(res)
    # The watchdog of rank 0 (node0, whose link is up) names the blocked call.
    assert re.search(r'chainermn watchdog: rank 0 of 2: call #\d+ allreduce_grad\(params=<4 arrays>\) '
                     r'has been blocked for [0-9.]+ s .* on host node0\.', res.stderr), report(res)
    assert seen['over'] is not None, report(res)
    record_figure('7b. node1 link down mid-training (2x1)', seen['over'],
                  's to exit: watchdog ({} s) on node0, launcher status {}'.format(timeout_s, res.returncode))
    assert seen['over'] < timeout_s + 20, report(res)
