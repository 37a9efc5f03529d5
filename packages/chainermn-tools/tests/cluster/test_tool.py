"""``python -m chainermn cluster`` and ``Cluster``: exit statuses, teardown on every path, the stale sweep."""

import os
import re
import select
import shutil
import signal
import subprocess
import sys
import time

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), '..', '..', '..', '..'))
CLI = [sys.executable, '-m', 'chainermn_tools', 'cluster']


def leftovers(prefix):
    """Everything named after cluster ``prefix`` that still exists on this machine."""
    from chainermn_tools.cluster._registry import SCRATCH_PARENT, cluster_dir
    found = []
    res = subprocess.run(['ip', 'netns', 'list'], stdout=subprocess.PIPE, text=True, check=True)
    found += ['netns ' + ln.split()[0] for ln in res.stdout.splitlines() if ln.startswith(prefix + '-')]
    for d, kind in (('/etc/netns', 'etc'), ('/sys/class/net', 'link')):
        if os.path.isdir(d):
            found += ['{} {}'.format(kind, n) for n in os.listdir(d) if n.startswith(prefix + '-')]
    if os.path.exists(os.path.join(cluster_dir(), prefix)):
        found.append('state dir ' + prefix)
    found += ['scratch ' + n for n in os.listdir(SCRATCH_PARENT) if n.startswith('chainermn-{}-'.format(prefix))]
    found += ['holder {}'.format(p) for p in _holders(prefix)]
    return found


def _holders(prefix):
    """Pids of processes started with a path of cluster ``prefix`` (its nodes' holders)."""
    mark = '/chainermn-{}-'.format(prefix).encode()
    pids = []
    for p in os.listdir('/proc'):
        try:
            with open('/proc/{}/cmdline'.format(p), 'rb') as f:
                args = f.read().split(b'\0')
        except OSError:
            continue
        if any(mark in a for a in args):
            pids.append(p)
    return pids


def prefix_in(text):
    m = re.search(r'/chainermn-(cmn[0-9a-f]{3})-[a-z0-9_]{8}/local', text)
    assert m, 'the command did not report its cluster:\n' + text
    return m.group(1)


def run_cli(args, timeout=180):
    return subprocess.run(CLI + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          timeout=timeout, cwd=ROOT, stdin=subprocess.DEVNULL)


# -- exit statuses and teardown -------------------------------------------------------------------
def test_cli_runs_ranks_on_every_node_and_cleans_up():
    res = run_cli(['--nodes', '2', '--ranks-per-node', '2', '--link-gbit', '1', '--',
                   'sh', '-c', 'echo "R=$PMI_RANK H=$(hostname) L=$CHAINERMN_NODE_LOCAL"'])
    assert res.returncode == 0, res.stdout + res.stderr
    prefix = prefix_in(res.stderr)
    got = sorted(re.findall(r'R=(\d) H=(node\d) L=(\S+)', res.stdout))
    assert [(r, h) for r, h, _ in got] == [('0', 'node0'), ('1', 'node0'), ('2', 'node1'), ('3', 'node1')]
    assert len({lp for _, _, lp in got}) == 1 and '/chainermn-{}-'.format(prefix) in got[0][2], got
    assert leftovers(prefix) == []


def test_cli_trains_the_mnist_example_on_two_nodes(tmp_path):
    # The README's example (2 epochs instead of 10).
    res = run_cli(['--nodes', '2', '--ranks-per-node', '1', '--', 'python', 'examples/mnist/train_mnist.py',
                   '--epoch', '2', '--no-progress', '--out', str(tmp_path / 'out')], timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    m = re.search(r'FINAL validation/main/accuracy=([0-9.]+) .* epochs=2 ranks=2', res.stdout)
    assert m and float(m.group(1)) > 0.5, res.stdout + res.stderr
    assert leftovers(prefix_in(res.stderr)) == []


def test_cli_returns_the_job_status_and_cleans_up():
    res = run_cli(['--nodes', '2', '--', 'sh', '-c', 'exit 3'])
    assert res.returncode == 3, res.stdout + res.stderr
    assert leftovers(prefix_in(res.stderr)) == []


def test_cli_timeout_kills_the_job_and_cleans_up():
    start = time.monotonic()
    res = run_cli(['--nodes', '2', '--timeout', '3', '--', 'sleep', '100'])
    assert res.returncode == 124, res.stdout + res.stderr
    assert 'ran past --timeout 3' in res.stderr
    assert time.monotonic() - start < 60
    assert leftovers(prefix_in(res.stderr)) == []


def _start_cli(args, ranks=2):
    """Start the command; return once every rank printed JOB-STARTED."""
    proc = subprocess.Popen(CLI + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT,
                            stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    out = b''
    while out.count(b'JOB-STARTED') < ranks and time.monotonic() < deadline and proc.poll() is None:
        if select.select([proc.stdout], [], [], 1.0)[0]:
            out += os.read(proc.stdout.fileno(), 4096)
    assert out.count(b'JOB-STARTED') == ranks, 'job did not start: {}'.format(out + proc.stderr.read())
    return proc


JOB = ('import signal, sys, time\n'
       'if sys.argv[1] == "ignore": signal.signal(signal.SIGTERM, signal.SIG_IGN)\n'
       'print("JOB-STARTED", flush=True)\n'
       'time.sleep(100)\n')


@pytest.mark.parametrize('sig,job,want', [
    (signal.SIGINT, 'plain', lambda rc: rc != 0),                    # Ctrl-C: the ranks get SIGINT
    (signal.SIGTERM, 'plain', lambda rc: rc != 0),                   # batch system stop
    (signal.SIGTERM, 'ignore', lambda rc: rc == 128 + signal.SIGTERM),   # ranks ignore it: killed after --grace
])
def test_cli_signal_stops_the_job_and_cleans_up(sig, job, want):
    proc = _start_cli(['--nodes', '2', '--grace', '3', '--', 'python', '-c', JOB, job])
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=120)
    err = err.decode(errors='replace')
    assert want(proc.returncode), (proc.returncode, err)
    assert 'got {}'.format(signal.Signals(sig).name) in err, err
    assert leftovers(prefix_in(err)) == []


def test_cli_second_signal_kills_at_once():
    proc = _start_cli(['--nodes', '2', '--grace', '300', '--', 'python', '-c', JOB, 'ignore'])
    proc.send_signal(signal.SIGTERM)
    err = b''
    while b'waiting up to 300 s' not in err:          # the first signal was handled
        chunk = os.read(proc.stderr.fileno(), 4096)
        assert chunk, err
        err += chunk
    proc.send_signal(signal.SIGINT)
    out, rest = proc.communicate(timeout=120)          # long before the 300 s grace
    err = (err + rest).decode(errors='replace')
    assert proc.returncode == 128 + signal.SIGTERM, (proc.returncode, err)
    assert 'second signal; killing the job now' in err, err
    assert leftovers(prefix_in(err)) == []


def test_cli_without_capabilities_exits_2_naming_them():
    if shutil.which('setpriv') is None:
        pytest.skip('needs setpriv (util-linux) to drop capabilities')
    res = subprocess.run(['setpriv', '--bounding-set', '-sys_admin,-net_admin', '--inh-caps', '-all'] + CLI
                         + ['--nodes', '2', '--', 'true'], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, timeout=120, cwd=ROOT)
    assert res.returncode == 2, res.stdout + res.stderr
    assert 'CAP_SYS_ADMIN' in res.stderr and 'CAP_NET_ADMIN' in res.stderr, res.stderr


def test_cli_netem_options_say_unavailable():
    from chainermn_tools.cluster import _net
    if _net.netem_available():
        pytest.skip('this kernel has netem: delay/loss are available')
    res = run_cli(['--nodes', '2', '--delay-ms', '5', '--', 'true'])
    assert res.returncode == 2, res.stdout + res.stderr
    assert 'needs the `netem` qdisc, which this kernel does not have' in res.stderr, res.stderr


def test_cli_usage_errors_exit_2():
    res = subprocess.run(CLI + ['--nodes', '2'], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         timeout=120, cwd=ROOT)
    assert res.returncode == 2 and 'give the command to run after --' in res.stderr


# -- the sweep at start: dead owners' clusters go, live ones stay ----------------------------------
OWNER = ('import sys\n'
         'from chainermn_tools.cluster import Cluster\n'
         'c = Cluster(nodes=2).start()\n'
         'print(c.prefix, flush=True)\n'
         'sys.stdin.read()\n'
         'c.close()\n')


def _owner():
    proc = subprocess.Popen([sys.executable, '-c', OWNER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            cwd=ROOT)
    prefix = proc.stdout.readline().decode().strip()
    assert re.match(r'^cmn[0-9a-f]{3}$', prefix), prefix
    return proc, prefix


def test_sweep_removes_dead_owners_clusters_only(make_cluster):
    dead, dead_prefix = _owner()
    live, live_prefix = _owner()
    try:
        assert any(x.startswith('netns') for x in leftovers(dead_prefix))
        dead.kill()                                   # SIGKILL: no teardown, the cluster stays behind
        dead.wait()
        cluster = make_cluster(1)                     # the next start sweeps it ...
        assert leftovers(dead_prefix) == []
        assert cluster.prefix not in (dead_prefix, live_prefix)
        # ... but not the cluster of a live run, which still works.
        assert any(x.startswith('netns') for x in leftovers(live_prefix))
        assert cluster.run(0, ['hostname']).stdout.strip() == 'node0'
    finally:
        live.communicate(b'', timeout=60)
    assert live.returncode == 0
    assert leftovers(live_prefix) == []


def test_context_manager_api(make_cluster):
    c = make_cluster(2, link_gbit=2)
    assert c.hostnames == ['node0', 'node1'] and len(set(c.addresses)) == 2
    assert all(os.path.isdir(n.scratch) for n in c.nodes)
    res = c.run(1, ['sh', '-c', 'hostname; echo $CHAINERMN_NODE_LOCAL; tc qdisc show dev eth0'])
    assert res.returncode == 0, res.stderr
    host, local, qdisc = res.stdout.splitlines()[:3]
    assert host == 'node1' and local == c.node_local and 'tbf' in qdisc and '2Gbit' in qdisc, res.stdout
    sleeper = c.popen(0, ['sleep', '100'])
    deadline = time.monotonic() + 60
    while [p[2] for p in c.processes(0)] != ['sleep'] and time.monotonic() < deadline:   # being entered
        time.sleep(0.01)
    procs = c.processes(0)
    assert [p[2] for p in procs] == ['sleep'] and c.processes(1) == []
    assert c.kill(0) == [procs[0][0]]
    assert sleeper.wait(timeout=30) == -signal.SIGKILL
    c.link_down(1)
    assert c.run(0, ['python', '-c', 'import socket; s = socket.socket(); s.settimeout(2); '
                     's.connect(("node1", 9))'], timeout=60).returncode != 0
    c.link_up(1)
    prefix = c.prefix
    c.close()
    c.close()
    assert leftovers(prefix) == []


def test_cli_binds_each_rank_to_a_cpu_of_its_own_where_the_cpus_suffice():
    from chainermn_tools.cluster._hosts import core_slices
    assert core_slices({0, 1, 2, 3}, 2, 2) == [[0, 1], [2, 3]]
    assert core_slices({0, 1}, 2, 2) is None  # more ranks than CPUs: not bound (the OS balances them)
    cpus = sorted(os.sched_getaffinity(0))
    res = run_cli(['--nodes', '2', '--', 'sh', '-c', 'echo "R=$PMI_RANK $(taskset -pc $$)"'])
    assert res.returncode == 0, res.stdout + res.stderr
    masks = dict(re.findall(r'R=(\d) pid \d+.s current affinity list: (\S+)', res.stdout))
    if len(cpus) >= 2:  # the nodes share this machine: each rank gets a CPU no other rank has
        assert masks == {'0': str(cpus[0]), '1': str(cpus[1])}, res.stdout
    assert leftovers(prefix_in(res.stderr)) == []
