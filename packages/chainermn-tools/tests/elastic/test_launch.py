"""``python -m chainermn launch`` on one host: Hydra reaches "hosts" through a stand-in for ssh.

The stand-in (``--launcher-exec``) runs the proxy locally and refuses hosts marked down (a file
``DOWN/<host>``), like ssh to an unreachable node.  Every launch runs under a hard timeout.
"""

import glob
import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
#: The repository root: the examples and the jobs shared with the root tests (tests/elastic/jobs).
ROOT = os.path.abspath(os.path.join(HERE, '..', '..', '..', '..'))
JOBS = os.path.join(ROOT, 'tests', 'elastic', 'jobs')
RESIZE_JOB = os.path.join(JOBS, 'resize_job.py')
TIMEOUT = 500

FAKE_SSH = '''#!/bin/sh
# stand-in for ssh: skip options, refuse hosts marked down, run the command here
while [ "${1#-}" != "$1" ]; do shift; done
host="$1"; shift
if [ -e "%(down)s/$host" ]; then echo "ssh: connect to host $host: No route to host" >&2; exit 255; fi
export CHAINERMN_TEST_CLUSTER="%(down)s" CHAINERMN_TEST_NODE="$host"
exec sh -c "$*"
'''


@pytest.fixture
def cluster(tmp_path):
    """Return ``(hosts_file, down_dir, launcher_exec)`` for two hosts, nodea and nodeb."""
    down = tmp_path / 'down'
    down.mkdir()
    ssh = tmp_path / 'fake_ssh'
    ssh.write_text(FAKE_SSH % {'down': down})
    ssh.chmod(0o755)
    hosts = tmp_path / 'hosts'
    hosts.write_text('# two nodes\nnodea\nnodeb\n')
    return str(hosts), str(down), str(ssh)


def start(cluster, command, *options, env=None):
    hosts, _, ssh = cluster
    cmd = [sys.executable, '-m', 'chainermn_tools', 'launch', '--hosts-file', hosts, '--ranks-per-node', '2',
           '--launcher-exec', ssh] + list(options) + ['--', sys.executable] + list(command)
    full = dict(os.environ, PYTHONUNBUFFERED='1', **(env or {}))
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=full,
                            start_new_session=True)


def launch(cluster, command, *options, env=None, during=None):
    proc = start(cluster, command, *options, env=env)
    try:
        if during is not None:
            during(proc)
        out, err = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail('launch timed out\n' + out.decode() + err.decode())
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return proc.returncode, out.decode(errors='replace'), err.decode(errors='replace')


def job(name):
    return os.path.join(JOBS, name)


def test_the_same_exception_twice_stops_and_is_shown_once(cluster):
    status, out, err = launch(cluster, [job('launch_job.py'), 'bug'], '--min-nodes', '1',
                              '--max-restarts', '3')
    text = out + err
    assert status != 0, text
    assert err.count('Traceback (most recent call last)') == 1, text
    assert err.count("raise RuntimeError('injected bug on every start')") == 1, text
    assert err.count('chainermn launch: starting 4 rank(s)') == 2, text   # one restart, not three
    assert 'the same exception twice in a row (RuntimeError: injected bug on every start)' in err, text


def test_a_new_exception_every_start_stops_after_max_restarts(cluster):
    status, out, err = launch(cluster, [job('launch_job.py'), 'bugs'], '--min-nodes', '2',
                              '--max-restarts', '2')
    text = out + err
    assert status != 0, text
    assert err.count('chainermn launch: starting 4 rank(s)') == 3, text
    assert '2 restart(s) used (--max-restarts 2); not restarting' in err, text
    for n in range(3):
        assert err.count('RuntimeError: injected bug number {}'.format(n)) >= 1, text


def test_preemption_is_restarted(cluster):
    status, out, err = launch(cluster, [job('launch_job.py'), 'preempt'], '--min-nodes', '2',
                              '--max-restarts', '1')
    text = out + err
    assert status == 0, text
    assert 'preempted (exit status 75)' in err and 'the job finished after 1 restart(s)' in err, text
    assert out.count('finished with 4 rank(s)') == 4, text


def test_a_host_that_stops_answering_mid_run_is_left_out(cluster):
    _, down, _ = cluster
    status, out, err = launch(cluster, [job('launch_job.py'), 'hang', os.path.join(down, 'nodeb')],
                              '--min-nodes', '1', '--max-restarts', '2', '--heartbeat', '1',
                              '--probe-timeout', '20', env={'CHAINERMN_TIMEOUT': '400'})
    text = out + err
    assert status == 0, text
    assert re.search(r'the job failed: lost host\(s\) nodeb \(probe exited with status \d+', err), text
    assert 'host nodeb left out' in err and 'hosts dropped: nodeb; added: none' in err, text
    assert out.count('finished with 2 rank(s)') == 2, text


def test_fewer_healthy_hosts_than_min_nodes_is_an_error(cluster):
    _, down, _ = cluster
    open(os.path.join(down, 'nodeb'), 'w').close()
    status, out, err = launch(cluster, [job('launch_job.py'), 'preempt'], '--min-nodes', '2')
    assert status != 0
    assert 'only 1 of the 2 host(s) of the hosts file' in err and '--min-nodes is 2' in err, out + err
    assert 'started' not in out


def test_a_node_lost_for_good_mid_training_resumes_on_the_survivor(cluster, tmp_path):
    _, down, _ = cluster
    out_dir = tmp_path / 'out'
    out_dir.mkdir()
    status, out, err = launch(cluster, [RESIZE_JOB, str(out_dir), '40i', 'serial'],
                              '--min-nodes', '1', '--max-restarts', '2',
                              env={'KILL_AT': '22', 'KILL_RANK': '2', 'DOWN_MARK': os.path.join(down, 'nodeb')})
    text = out + err
    assert status == 0, text
    assert 'host nodeb left out' in err and 'hosts dropped: nodeb; added: none' in err, text
    m = re.search(r'restart 1: generation (\d+) loaded; (\d+) iteration\(s\) redone \(the failed attempt '
                  r'reached iteration (\d+)\); training again ([0-9.]+) s after the failure', err)
    assert m and m.groups()[:3] == ('20', '2', '22'), text
    assert out.count('done at iteration 40') == 2, text
    states = [json.load(open(str(out_dir / 'resume.{}.json'.format(r)))) for r in range(2)]
    assert all(st['loaded'] == 20 and st['size'] == 2 for st in states), states
    print('node lost: training again {} s after the failure; 2 iterations redone (21, 22)'.format(m.group(4)))


def test_a_node_lost_with_sharded_optimizer_state_resumes_as_unsharded_would(cluster, tmp_path):
    """shard_state=True: the survivors gather the lost node's shares (its files are on a shared disk)."""
    _, down, _ = cluster
    finals = {}
    for shard in ('1', '0'):
        out_dir = tmp_path / 'out{}'.format(shard)
        out_dir.mkdir()
        if os.path.exists(os.path.join(down, 'nodeb')):
            os.remove(os.path.join(down, 'nodeb'))
        status, out, err = launch(cluster, [RESIZE_JOB, str(out_dir), '40i', 'elastic'],
                                  '--min-nodes', '1', '--max-restarts', '2',
                                  env={'KILL_AT': '22', 'KILL_RANK': '2', 'SHARD_STATE': shard,
                                       'DOWN_MARK': os.path.join(down, 'nodeb')})
        text = out + err
        assert status == 0, text
        assert 'hosts dropped: nodeb; added: none' in err and out.count('done at iteration 40') == 2, text
        assert ('sharded optimizer state gathered from 4 file(s)' in err) == (shard == '1'), text
        states = [json.load(open(str(out_dir / 'resume.{}.json'.format(r)))) for r in range(2)]
        assert all(st['loaded'] == 20 and st['size'] == 2 for st in states), states
        with numpy.load(str(out_dir / 'final.0.npz')) as f:
            finals[shard] = dict(f)
    for key, want in finals['0'].items():
        numpy.testing.assert_allclose(finals['1'][key], want, rtol=1e-6, atol=1e-7, err_msg=key)


def test_a_repaired_host_rejoins_at_the_next_start(cluster):
    _, down, _ = cluster
    mark = os.path.join(down, 'nodeb')
    open(mark, 'w').close()
    status, out, err = launch(cluster, [job('launch_job.py'), 'repair', mark], '--min-nodes', '1',
                              '--max-restarts', '1')
    text = out + err
    assert status == 0, text
    # Both "hosts" are this machine: the probe counts its CPUs, and 2 ranks per host get a core each.
    bound = '; one core per rank (-bind-to core)' if len(os.sched_getaffinity(0)) >= 2 else \
        '; ranks not bound to cores (nodea: {} has fewer CPUs than --ranks-per-node 2)'.format(
            len(os.sched_getaffinity(0)))
    assert 'host nodeb left out' in err and 'starting 2 rank(s) on nodea{}\n'.format(bound) in err, text
    assert 'hosts dropped: none; added: nodeb; starting on 2 host(s): nodea, nodeb' in err, text
    assert out.count('finished with 4 rank(s)') == 4, text


def _processes_of(down, node):
    """PIDs of the processes the stand-in for ssh started on ``node`` of this test's cluster."""
    want = {'CHAINERMN_TEST_CLUSTER=' + down, 'CHAINERMN_TEST_NODE=' + node}
    pids = []
    for path in glob.glob('/proc/[0-9]*/environ'):
        try:
            with open(path, 'rb') as f:
                env = set(f.read().decode(errors='replace').split('\0'))
        except OSError:
            continue
        if want <= env:
            pids.append(int(path.split('/')[2]))
    return pids


def test_mnist_example_survives_losing_a_node_for_good(cluster, tmp_path):
    """Test 3 on one host: 2 nodes x 2 ranks, node-local snapshots, nodeb lost for good mid-training."""
    _, down, _ = cluster
    ckpt = tmp_path / 'ckpt'
    example = os.path.join(ROOT, 'examples', 'mnist', 'train_mnist.py')
    lost = {}

    def recorded(node, rank):
        try:
            with open(str(ckpt / node / '.mnist.{}.complete'.format(rank))) as f:
                return 10 in json.load(f)['iterations']
        except (OSError, ValueError, KeyError):
            return False

    def lose_nodeb(proc):
        # Generation 10 is complete once every rank's file of it is on disk (each appears by os.replace)
        # and, written in the background (the default), once the ranks agreed on it: nodea's records
        # say so (the agreement comes within an iteration or two of the last write's end).  Without
        # the record, nodea's files alone cannot tell that nodeb's writes finished, and losing nodeb
        # then rightly falls back to generation 5.
        targets = [ckpt / node / 'mnist.{}.10'.format(rank)
                   for node, ranks in (('nodea', (0, 1)), ('nodeb', (2, 3))) for rank in ranks]
        while not (all(t.exists() for t in targets) and recorded('nodea', 0) and recorded('nodea', 1)):
            assert proc.poll() is None, 'the launcher ended before generation 10 was complete'
            time.sleep(0.01)
        open(os.path.join(down, 'nodeb'), 'w').close()   # its link is down: probes fail from now on
        lost['at'] = time.time()
        for pid in _processes_of(down, 'nodeb'):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    status, out, err = launch(
        cluster, [example, '--checkpoint', str(ckpt) + '/${CHAINERMN_TEST_NODE}', '--checkpoint-interval',
                  '5', '--epoch', '10', '--no-progress'],
        '--min-nodes', '1', '--max-restarts', '2', during=lose_nodeb)
    text = out + err
    assert status == 0, text
    assert 'host nodeb left out' in err and 'hosts dropped: nodeb; added: none' in err, text
    m = re.search(r'restart 1: generation (\d+) loaded; (\d+) iteration\(s\) redone \(the failed attempt '
                  r'reached iteration (\d+)\); training again ([0-9.]+) s after the failure '
                  r'\(first iteration at unix time ([0-9.]+)\)', err)
    assert m, text
    generation, redone, reached = int(m.group(1)), int(m.group(2)), int(m.group(3))
    assert generation >= 10 and redone == reached - generation and 0 <= redone < 5, text
    accuracy = float(re.search(r'FINAL validation/main/accuracy=([0-9.]+)', out).group(1))
    assert accuracy > 0.9, text
    assert 'ranks=2' in out, text
    print('mnist node lost: accuracy {:.4f}; training again {:.1f} s after the loss ({} s after mpiexec '
          'ended); generation {} loaded, {} iteration(s) redone'.format(
              accuracy, float(m.group(5)) - lost['at'], m.group(4), generation, redone))


def test_hosts_file_lines(tmp_path):
    from chainermn_tools.launch._hosts import read_hosts
    path = tmp_path / 'hosts'
    path.write_text('# cluster\nnode1:4\n\nnode2  # spare\nnode1\n  node3 slots=2\n')
    assert read_hosts(str(path)) == ['node1', 'node2', 'node3']


def test_ranks_are_bound_to_cores_only_where_every_host_has_enough():
    import argparse
    from chainermn_tools.launch import _binding
    args = argparse.Namespace(ranks_per_node=4, bind_to='auto')
    assert _binding(args, ['a', 'b'], {'a': 8, 'b': 4}) == (['-bind-to', 'core'],
                                                            '; one core per rank (-bind-to core)')
    assert _binding(args, ['a', 'b'], {'a': 8, 'b': 2}) == (
        [], '; ranks not bound to cores (b: 2 has fewer CPUs than --ranks-per-node 4)')
    assert _binding(args, ['a'], {})[0] == []   # no count from the probe: not bound
    args.bind_to = 'core'
    assert _binding(args, ['a'], {'a': 1})[0] == ['-bind-to', 'core']
    args.bind_to = 'none'
    assert _binding(args, ['a'], {'a': 64}) == ([], '; ranks not bound to cores')
