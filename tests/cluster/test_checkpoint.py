"""Checkpoints in node-local scratch across nodes (issue 15, tests 5 and 7c).

The job (``tests/faults/jobs/job_train.py``) checkpoints every 2 iterations into
``$CHAINERMN_NODE_LOCAL/ckpt``: each node's scratch, which no other node sees.  Runs are killed or
preempted at a gate iteration, relaunched on the same nodes, and must end with parameters bitwise
equal to an uninterrupted run -- or resume from an older generation every rank still has.
"""

import os
import re
import shutil
import signal
import time

import numpy
import pytest

from chainermn.cluster import Cluster

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
JOB = os.path.join(ROOT, 'tests', 'faults', 'jobs', 'job_train.py')
ITERATIONS = 30
GATE = 13           # generations at 2, 4, ..., 12 exist when the gate is reached


def report(res):
    return 'status {} after {:.1f}s{}\n--- stdout ---\n{}\n--- stderr ---\n{}'.format(
        res.returncode, res.seconds, ' (TIMED OUT)' if res.timed_out else '',
        res.stdout[-6000:], res.stderr[-12000:])


@pytest.fixture(scope='module')
def cluster(request):
    request.getfixturevalue('require_cluster')
    c = Cluster(nodes=2).start()
    yield c
    c.close()


def wipe(cluster):
    for node in cluster.nodes:
        for name in os.listdir(node.scratch):
            path = os.path.join(node.scratch, name)
            shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)


def train(cluster, extra=(), on_start=None):
    return cluster.mpiexec([JOB, cluster.node_local, ITERATIONS] + [str(a) for a in extra], ranks_per_node=1,
                           timeout=150, on_start=on_start, env={'CHAINERMN_TIMEOUT': '60'})


def final_params(cluster):
    with numpy.load(os.path.join(cluster.nodes[0].scratch, 'final.npz')) as f:     # rank 0 is on node0
        return {k: f[k].copy() for k in f.files}


def assert_same_params(a, b):
    assert sorted(a) == sorted(b)
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, k
        assert numpy.array_equal(a[k], b[k]), '{} differs:\n{}\n{}'.format(k, a[k], b[k])


def resumed_at(res):
    return sorted(re.findall(r'FAULT-RESUMED-AT rank=(\d) iteration=(\d+)', res.stderr))


def ckpt_files(node):
    d = os.path.join(node.scratch, 'ckpt')
    return sorted(n for n in os.listdir(d) if not n.startswith('.')) if os.path.isdir(d) else []


@pytest.fixture(scope='module')
def reference(cluster):
    """Final parameters of an uninterrupted run on the cluster."""
    wipe(cluster)
    res = train(cluster)
    assert res.returncode == 0, report(res)
    assert resumed_at(res) == [('0', '0'), ('1', '0')], report(res)
    return final_params(cluster)


def stop_at_gate(cluster, sig, record_figure=None, case=None):
    """Run until rank 1 waits at the gate, send ``sig`` to every process of node1 (SIGKILL: of both nodes)."""
    seen = {}

    def inject(proc):
        pid_file = os.path.join(cluster.nodes[1].scratch, 'pid.1')          # written in node1's scratch
        deadline = time.monotonic() + 90
        while not os.path.exists(pid_file) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        if os.path.exists(pid_file):
            seen['t0'] = time.monotonic()
            for node in (cluster.nodes if sig == signal.SIGKILL else cluster.nodes[1:]):
                cluster.kill(node, sig)
            proc.wait(timeout=120)
            seen['over'] = time.monotonic() - seen['t0']

    res = train(cluster, ['--gate', GATE, '--cp-every', 2, '--gate-ranks', 1], on_start=inject)
    assert 'over' in seen, report(res)
    if record_figure is not None:
        record_figure(case, seen['over'], 's to exit (status {})'.format(res.returncode))
    return res


# -- 5. checkpointer with node-local directories ----------------------------------------------------
def test_killed_job_resumes_from_node_local_checkpoints(cluster, reference, tmp_path, record_figure):
    wipe(cluster)
    res = stop_at_gate(cluster, signal.SIGKILL, record_figure, '5. SIGKILL both nodes at it {} (2x1)'.format(GATE))
    assert not res.timed_out and res.returncode != 0, report(res)
    # Each node holds its own rank's generations, and only those.
    gens = ['faultrun.{{}}.{}'.format(i) for i in range(2, GATE, 2)]
    for node in cluster.nodes:
        assert ckpt_files(node) == sorted(g.format(node.index) for g in gens), ckpt_files(node)
    saved = tmp_path / 'saved'
    for node in cluster.nodes:
        shutil.copytree(node.scratch, str(saved / node.hostname))

    def restore():
        wipe(cluster)
        for node in cluster.nodes:
            shutil.copytree(str(saved / node.hostname), node.scratch, dirs_exist_ok=True)

    # Relaunch: every rank resumes from the newest generation (12) and ends where the reference ended.
    res = train(cluster)
    assert res.returncode == 0, report(res)
    assert resumed_at(res) == [('0', '12'), ('1', '12')], report(res)
    assert_same_params(final_params(cluster), reference)

    # node1 lost its newest generation: resume from the newest one every rank still has (10).
    restore()
    os.remove(os.path.join(cluster.nodes[1].scratch, 'ckpt', 'faultrun.1.12'))
    res = train(cluster)
    assert res.returncode == 0, report(res)
    assert resumed_at(res) == [('0', '10'), ('1', '10')], report(res)
    assert_same_params(final_params(cluster), reference)

    # node1's scratch wiped: every rank resumes from node0's newest file (issue 20: no silent restart
    # from zero while a usable generation exists); rank 1's iterator is rebuilt at the same position.
    restore()
    shutil.rmtree(os.path.join(cluster.nodes[1].scratch, 'ckpt'))
    res = train(cluster)
    assert res.returncode == 0, report(res)
    assert resumed_at(res) == [('0', '12'), ('1', '12')], report(res)
    assert 'resharded from' in res.stderr, report(res)
    assert_same_params(final_params(cluster), reference)


# -- 7c. a node preempted: SIGTERM to every process of node1 ----------------------------------------
def test_preempted_node_checkpoints_all_ranks_and_resumes(cluster, reference, record_figure):
    from chainermn_train.preemption import PREEMPTED_EXIT_STATUS
    wipe(cluster)
    res = stop_at_gate(cluster, signal.SIGTERM, record_figure,
                       '7c. SIGTERM every process of node1 at it {} (2x1)'.format(GATE))
    assert not res.timed_out and res.returncode == PREEMPTED_EXIT_STATUS, report(res)
    for r, why in ((0, 'another rank received a stop signal'), (1, 'this rank received SIGTERM')):
        assert ('rank {}: preempted ({}); all ranks stop at iteration {}; checkpoint written; exiting with '
                'status {}'.format(r, why, GATE, PREEMPTED_EXIT_STATUS)) in res.stderr, report(res)
    for node in cluster.nodes:          # the consistent checkpoint, in each node's own scratch
        assert 'faultrun.{}.{}'.format(node.index, GATE) in ckpt_files(node), ckpt_files(node)
    res = train(cluster)
    assert res.returncode == 0, report(res)
    assert resumed_at(res) == [('0', str(GATE)), ('1', str(GATE))], report(res)
    assert_same_params(final_params(cluster), reference)
