"""The cluster tool's registry cannot be turned against root: refused unless private; kills and deletes only its own.

Each test uses a registry of its own (``CHAINERMN_CLUSTER_DIR`` under a fresh private directory)
and removes everything it made, clusters and victims, also when it fails. Needs root (namespaces,
veths, acting as uid 65534 through ``setpriv``).
"""

import json
import os
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
import warnings

import pytest

NOBODY = 65534
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _why_skip():
    if os.geteuid() != 0:
        return 'needs root (namespaces, veths, acting as uid 65534)'
    if shutil.which('setpriv') is None:
        return 'needs setpriv (util-linux) to act as uid 65534'
    from chainermn_tools.cluster import missing
    problems = missing()
    return 'cannot build a cluster of namespaces here: ' + '; '.join(problems) if problems else None


pytestmark = pytest.mark.skipif(_why_skip() is not None, reason=_why_skip() or '')


# -- helpers --------------------------------------------------------------------------------------
def as_nobody(*cmd):
    """Run ``cmd`` as uid/gid 65534; return the completed process."""
    return subprocess.run(['setpriv', '--reuid={}'.format(NOBODY), '--regid={}'.format(NOBODY),
                           '--clear-groups'] + list(cmd), capture_output=True, text=True, timeout=60)


def ip(*args, check=True):
    return subprocess.run(['ip'] + list(args), capture_output=True, text=True, timeout=60, check=check)


def ifindex(name):
    try:
        with open('/sys/class/net/{}/ifindex'.format(name)) as f:
            return int(f.read())
    except OSError:
        return None


def netns_ino(name):
    try:
        return os.stat(os.path.join('/run/netns', name)).st_ino
    except OSError:
        return None


def start_time(pid):
    from chainermn_tools.cluster._registry import process_start
    return process_start(pid)


def dead_pid():
    proc = subprocess.Popen(['true'])
    proc.wait()
    return proc.pid


def free_prefix(avoid=()):
    """A cluster prefix no name on this machine uses."""
    from chainermn_tools.cluster import _net, _registry
    taken = _net.used_subnets() | _registry.names_in_use() | {_registry.index_of(p) for p in avoid}
    return _registry.prefix_for(_registry.pick_index(taken))


def machine():
    """Interfaces and network namespaces of this machine that no cluster names (``cmn``...)."""
    links = {n: ifindex(n) for n in os.listdir('/sys/class/net') if not n.startswith('cmn')}
    netns = {n: netns_ino(n) for n in (os.listdir('/run/netns') if os.path.isdir('/run/netns') else [])
             if not n.startswith('cmn')}
    return links, netns


def leftovers(prefix, registry):
    """Everything of cluster ``prefix`` that still exists."""
    mark = prefix + '-'
    found = ['link ' + n for n in os.listdir('/sys/class/net') if n.startswith(mark)]
    for d in ('/run/netns', '/etc/netns'):
        if os.path.isdir(d):
            found += ['{} {}'.format(d, n) for n in os.listdir(d) if n.startswith(mark)]
    found += ['scratch ' + n for n in os.listdir('/var/tmp') if n.startswith('chainermn-' + mark)]
    if os.path.exists(os.path.join(registry, prefix)):
        found.append('state dir ' + prefix)
    return found


def purge(registry):
    """Remove, by brute force, every cluster recorded in the test registry ``registry`` (cleanup)."""
    if not os.path.isdir(registry):
        return
    for prefix in os.listdir(registry):
        if not prefix.startswith('cmn'):
            continue
        try:
            with open(os.path.join(registry, prefix, 'state.json')) as f:
                state = json.load(f)
        except (OSError, ValueError):
            state = {}
        if state.get('version') != 2 or state.get('registry') != registry:
            continue            # planted by a test: what it names is cleaned by that test's fixture
        for node in state.get('nodes', []):
            pid = node.get('holder_pid')
            if pid and start_time(pid) == node.get('holder_start'):
                os.kill(pid, signal.SIGKILL)
        for n in os.listdir('/sys/class/net'):
            if n.startswith(prefix + '-'):
                ip('link', 'del', n, check=False)
        for n in os.listdir('/run/netns') if os.path.isdir('/run/netns') else []:
            if n.startswith(prefix + '-'):
                ip('netns', 'del', n, check=False)
        for n in os.listdir('/etc/netns') if os.path.isdir('/etc/netns') else []:
            if n.startswith(prefix + '-'):
                shutil.rmtree(os.path.join('/etc/netns', n), ignore_errors=True)
        for n in os.listdir('/var/tmp'):
            if n.startswith('chainermn-{}-'.format(prefix)):
                shutil.rmtree(os.path.join('/var/tmp', n), ignore_errors=True)


@pytest.fixture
def registry(monkeypatch):
    """A fresh registry path (not made yet) under a private directory; everything in it purged after."""
    from chainermn_comm.protocol import CLUSTER_DIR_ENV
    base = tempfile.mkdtemp(prefix='chainermn-sec-', dir='/var/tmp')
    path = os.path.join(base, 'registry')
    monkeypatch.setenv(CLUSTER_DIR_ENV, path)
    try:
        yield path
    finally:
        purge(path)
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def closing():
    """Return ``keep(obj)``: ``obj.close()`` (a Cluster) or kill (a Popen) at the end, in reverse order."""
    kept = []
    yield kept.append
    for obj in reversed(kept):
        if isinstance(obj, subprocess.Popen):
            if obj.poll() is None:
                obj.kill()
            obj.wait()
        else:
            obj.close()


def cluster(nodes=1):
    from chainermn_tools.cluster import Cluster
    return Cluster(nodes=nodes).start()


# -- the registry itself ---------------------------------------------------------------------------
def test_registry_made_first_by_another_user_is_refused(closing, monkeypatch):
    from chainermn_comm.protocol import CLUSTER_DIR_ENV
    from chainermn_tools.cluster import ClusterUnavailable
    path = '/var/tmp/chainermn-sec-reg-{}'.format(secrets.token_hex(6))
    victim = subprocess.Popen(['sleep', '300'], start_new_session=True)
    closing(victim)
    try:
        state = {'version': 2, 'registry': path, 'prefix': 'cmn001', 'index': 1, 'token': '0' * 32,
                 'owner_pid': dead_pid(), 'owner_start': 1, 'bridge': 'cmn001-br',
                 'nodes': [{'hostname': 'node0', 'netns': 'cmn001-node0', 'link': 'cmn001-v0',
                            'holder_pid': victim.pid, 'holder_start': start_time(victim.pid)}]}
        made = as_nobody('sh', '-c', 'mkdir -m 700 "$1" && mkdir -m 700 "$1/cmn001" && '
                         'printf %s "$2" > "$1/cmn001/state.json"', 'sh', path, json.dumps(state))
        assert made.returncode == 0, made.stderr
        before = sorted(os.listdir(path))
        monkeypatch.setenv(CLUSTER_DIR_ENV, path)
        with pytest.raises(ClusterUnavailable) as err:
            cluster(1)
        msg = str(err.value)
        assert path in msg and 'uid 65534' in msg and 'mode 0700' in msg and 'rm -rf' in msg, msg
        assert isinstance(err.value, PermissionError)
        # The command says the same and exits 2.
        res = subprocess.run([sys.executable, '-m', 'chainermn_tools', 'cluster', '--nodes', '1', '--',
                              'true'], capture_output=True, text=True, timeout=120, cwd=ROOT,
                             stdin=subprocess.DEVNULL)
        assert res.returncode == 2 and 'refusing the cluster registry ' + path in res.stderr, res.stderr
        st = os.stat(path)
        assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (NOBODY, 0o700)     # never "fixed"
        assert sorted(os.listdir(path)) == before                          # nothing written in it
        assert victim.poll() is None and start_time(victim.pid) is not None
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.mark.parametrize('mode', [0o777, 0o1777, 0o755, 'symlink'])
def test_registry_open_to_others_or_a_link_is_refused(registry, mode):
    from chainermn_tools.cluster import ClusterUnavailable
    if mode == 'symlink':
        real = registry + '.real'
        os.mkdir(real, 0o700)
        os.symlink(real, registry)
    else:
        os.mkdir(registry)
        os.chmod(registry, mode)
    with pytest.raises(ClusterUnavailable) as err:
        cluster(1)
    msg = str(err.value)
    assert registry in msg and ('symbolic link' in msg if mode == 'symlink'
                                else 'mode {:04o}'.format(mode) in msg and 'chmod 700' in msg), msg
    if mode != 'symlink':
        assert stat.S_IMODE(os.stat(registry).st_mode) == mode
    assert os.listdir(registry) == []


# -- planted state files ---------------------------------------------------------------------------
@pytest.fixture
def victims(registry, closing):
    """Things outside any cluster a planted state names: processes, directories, a veth, a bridge, a netns."""
    prefix = free_prefix()
    v = {'prefix': prefix, 'root_proc': subprocess.Popen(['sleep', '300'], start_new_session=True)}
    closing(v['root_proc'])
    v['nobody_proc'] = subprocess.Popen(['setpriv', '--reuid={}'.format(NOBODY), '--regid={}'.format(NOBODY),
                                         '--clear-groups', 'sleep', '300'], start_new_session=True)
    closing(v['nobody_proc'])
    v['dir'] = tempfile.mkdtemp(prefix='chainermn-victim-', dir='/tmp')
    v['scratch'] = os.path.join('/var/tmp', 'chainermn-{}-victim00'.format(prefix))
    v['etc'] = os.path.join('/etc/netns', prefix + '-node0')
    v['link'], v['bridge'], v['netns'] = prefix + '-v0', prefix + '-br', prefix + '-node0'
    v['peer'] = 'cmsec{}p'.format(secrets.token_hex(3))
    try:
        for d in (v['dir'], v['scratch'], v['etc']):
            os.makedirs(d, exist_ok=True)
            with open(os.path.join(d, 'keep'), 'w') as f:
                f.write('victim')
        ip('link', 'add', v['link'], 'type', 'veth', 'peer', 'name', v['peer'])
        ip('link', 'add', v['bridge'], 'type', 'bridge')
        ip('netns', 'add', v['netns'])
        v['ids'] = {'link': ifindex(v['link']), 'bridge': ifindex(v['bridge']), 'netns': netns_ino(v['netns'])}
        yield v
    finally:
        ip('link', 'del', v['link'], check=False)
        ip('link', 'del', v['bridge'], check=False)
        ip('netns', 'del', v['netns'], check=False)
        for d in (v['dir'], v['scratch'], v['etc']):
            shutil.rmtree(d, ignore_errors=True)


def plant(registry, prefix, state, owner=None):
    d = os.path.join(registry, prefix)
    os.mkdir(d, 0o700)
    path = os.path.join(d, 'state.json')
    with open(path, 'w') as f:
        json.dump(state, f)
    os.chmod(path, 0o600)
    if owner is not None:
        os.chown(d, owner, owner)
        os.chown(path, owner, owner)
    return path


def v2_state(registry, prefix, v, holder):
    """A state as this registry writes it, naming the victims (with identities that are not theirs)."""
    return {'version': 2, 'registry': registry, 'prefix': prefix, 'index': int(prefix[3:], 16),
            'subnet': '198.18.0.0/24', 'owner_pid': dead_pid(), 'owner_start': 1,
            'token': secrets.token_hex(16), 'head_address': '198.18.0.1',
            'bridge': prefix + '-br', 'bridge_ifindex': v['ids']['bridge'] + 1000,
            'scratch': v['scratch'], 'scratch_id': [1, 2],
            'nodes': [{'hostname': 'node0', 'address': '198.18.0.2', 'netns': prefix + '-node0',
                       'netns_id': [4, 1], 'etc_id': [1, 3], 'link': prefix + '-v0',
                       'link_ifindex': v['ids']['link'] + 1000, 'holder_pid': holder.pid,
                       'holder_start': start_time(holder.pid)}]}


def test_planted_state_files_kill_and_delete_nothing(registry, victims, closing):
    v = victims
    os.mkdir(registry, 0o700)
    real = os.path.realpath(registry)
    others = [free_prefix(avoid=[v['prefix']])]
    for _ in range(4):
        others.append(free_prefix(avoid=[v['prefix']] + others))
    # 1. exactly what this registry writes, but proving nothing: the holder is a victim without
    #    the token, every identity is wrong. The cluster is "dead": its state goes, nothing else.
    plant(registry, v['prefix'], v2_state(real, v['prefix'], v, v['root_proc']))
    # 2. what an older chainermn wrote: no version, no token; an absolute netns, a foreign link
    old = {'prefix': others[0], 'index': int(others[0][3:], 16), 'owner_pid': dead_pid(), 'owner_start': 1,
           'bridge': v['bridge'], 'nodes': [{'netns': v['dir'], 'link': v['link'],
                                             'holder_pid': v['nobody_proc'].pid,
                                             'holder_start': start_time(v['nobody_proc'].pid)}]}
    refused = [plant(registry, others[0], old)]
    # 3. this version, but the namespace climbs out of /etc/netns
    climb = v2_state(real, others[1], v, v['nobody_proc'])
    climb['nodes'][0]['netns'] = '../..' + v['dir']
    refused.append(plant(registry, others[1], climb))
    # 4. another user's state file in our registry
    refused.append(plant(registry, others[2], v2_state(real, others[2], v, v['root_proc']), owner=NOBODY))
    # 5. a state of another registry (the old default)
    foreign = v2_state('/var/tmp/chainermn-cluster', others[3], v, v['root_proc'])
    refused.append(plant(registry, others[3], foreign))
    # 6. a symlink in place of a state file
    os.mkdir(os.path.join(registry, others[4]), 0o700)
    refused.append(os.path.join(registry, others[4], 'state.json'))
    os.symlink(os.path.join(v['dir'], 'keep'), refused[-1])
    before = machine()

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        c = cluster(1)
        closing(c)
    said = [str(w.message) for w in caught if str(w.message).startswith('chainermn cluster: leaving')]
    for path in refused:
        assert sum(path in m for m in said) == 1, (path, said)
    assert len(said) == len(refused), said
    assert c.prefix not in [v['prefix']] + others            # names in use are never reused
    assert c.run(0, ['hostname']).stdout.strip() == 'node0'
    prefix = c.prefix
    c.close()
    assert leftovers(prefix, registry) == []
    with warnings.catch_warnings(record=True):
        warnings.simplefilter('always')
        closing(cluster(1))                                   # a second start: still nothing touched

    for proc in (v['root_proc'], v['nobody_proc']):
        assert proc.poll() is None, 'a victim process was killed'
    for d in (v['dir'], v['scratch'], v['etc']):
        with open(os.path.join(d, 'keep')) as f:
            assert f.read() == 'victim', d
    assert {'link': ifindex(v['link']), 'bridge': ifindex(v['bridge']), 'netns': netns_ino(v['netns'])} \
        == v['ids']
    assert machine() == before                               # nothing outside the clusters changed
    assert not os.path.exists(os.path.join(registry, v['prefix']))   # the dead state itself is gone
    for path in refused:                                     # the refused ones stay for a person
        assert os.path.lexists(path), path


# -- what must still work --------------------------------------------------------------------------
def test_start_stop_in_a_new_private_registry(registry):
    c = cluster(2)
    try:
        st = os.stat(registry)
        assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, 0o700)
        state = os.path.join(registry, c.prefix, 'state.json')
        assert stat.S_IMODE(os.stat(state).st_mode) == 0o600
        scratch = os.path.dirname(c.node_local)
        assert os.path.dirname(scratch) == '/var/tmp' and stat.S_IMODE(os.stat(scratch).st_mode) == 0o700
        assert c.run(1, ['hostname']).stdout.strip() == 'node1'
        assert leftovers(c.prefix, registry) != []
    finally:
        c.close()
    assert leftovers(c.prefix, registry) == []


OWNER = ('import sys\n'
         'from chainermn_tools.cluster import Cluster\n'
         'c = Cluster(nodes=2).start()\n'
         'print(c.prefix, flush=True)\n'
         'sys.stdin.read()\n')


def owner(closing, env=None):
    proc = subprocess.Popen([sys.executable, '-c', OWNER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, env=dict(os.environ, **(env or {})))
    closing(proc)
    prefix = proc.stdout.readline().strip()
    assert prefix.startswith('cmn'), prefix
    return proc, prefix


def test_dead_owners_cluster_is_swept_other_registries_are_not(registry, closing, tmp_path, monkeypatch):
    from chainermn_comm.protocol import CLUSTER_DIR_ENV
    other = str(tmp_path / 'other-registry')
    dead, prefix = owner(closing)
    theirs, their_prefix = owner(closing, {CLUSTER_DIR_ENV: other})
    try:
        for proc in (dead, theirs):
            proc.kill()                          # SIGKILL: no teardown; the holders die with it
            proc.wait()
        assert any(x.startswith('/run/netns') for x in leftovers(prefix, registry))
        their_before = leftovers(their_prefix, other)
        assert any(x.startswith('/run/netns') for x in their_before)
        c = cluster(1)                           # sweeps this registry's dead cluster only
        try:
            assert leftovers(prefix, registry) == []
            assert leftovers(their_prefix, other) == their_before
            assert c.prefix != their_prefix
        finally:
            c.close()
    finally:
        swept = []
        with monkeypatch.context() as m:
            m.setenv(CLUSTER_DIR_ENV, other)
            try:
                cluster(1).close()               # its own registry sweeps it
                swept = leftovers(their_prefix, other)
            finally:
                purge(other)
    assert swept == []


def test_live_holder_of_a_dead_owner_is_killed_when_it_carries_the_token(registry, closing):
    from chainermn_tools.cluster import _registry
    first = cluster(2)
    closing(first)
    holders = [n.holder_pid for n in first.nodes]
    path = os.path.join(registry, first.prefix, 'state.json')
    with open(path) as f:
        state = json.load(f)
    state.update(owner_pid=dead_pid(), owner_start=1)   # as if its owner died without taking the nodes
    _registry.write_state(os.path.realpath(registry), state)
    second = cluster(1)
    closing(second)
    deadline = time.monotonic() + 30
    while any(start_time(p) is not None for p in holders) and time.monotonic() < deadline:
        time.sleep(0.01)                          # reaped by their parent
    assert [start_time(p) for p in holders] == [None, None]
    assert leftovers(first.prefix, registry) == []
    with pytest.warns(UserWarning, match='already removed by another run'):
        first.close()                             # its names may be another cluster's by now
    assert second.run(0, ['hostname']).stdout.strip() == 'node0'
