"""A Slurm cluster on one machine: a head and N nodes, each in its own Linux namespaces.

The head (slurmctld, munged, where srun runs) has its own network, UTS and mount namespaces
with a bridge at 198.18.0.1; every node has its own network (a veth on that bridge,
198.18.0.11, .12, ...), UTS (hostname nodeI), IPC, mount (private /dev/shm, a tmpfs over
/sys/fs/cgroup) and PID namespaces.  Nothing touches the host's network, cgroups or daemons,
and killing each namespace's init removes every process, mount and link it held.  Needs root
(or CAP_SYS_ADMIN + CAP_NET_ADMIN), util-linux's unshare/nsenter and iproute2's ip.
"""

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from chainermn.slurm._conf import Node, write_config
from chainermn.slurm._daemons import SlurmDaemons, find_slurm

__all__ = ['NamespaceError', 'Namespaces', 'LocalSlurmCluster', 'local_cluster', 'HEAD_ADDR',
           'node_addr']

HEAD_ADDR = '198.18.0.1'

# PID 1 of each namespace: reaps orphans (slurmstepd's children) and exits on SIGTERM, which
# makes the kernel kill everything else in the namespace.
_INIT = ('import os, signal\n'
         'signal.signal(signal.SIGTERM, lambda *a: os._exit(0))\n'
         'signal.signal(signal.SIGCHLD, lambda *a: None)\n'
         'while True:\n'
         '    try:\n'
         '        os.wait()\n'
         '    except ChildProcessError:\n'
         '        signal.pause()\n')


class NamespaceError(RuntimeError):
    """Linux namespaces (or the tools to make them) are not available here."""


def node_addr(i):
    """Return the address of node ``i`` (1-based) on the head's bridge."""
    return '198.18.0.{}'.format(10 + i)


def _tools():
    missing = [t for t in ('unshare', 'nsenter', 'ip') if not shutil.which(t) and not
               os.access('/usr/sbin/' + t, os.X_OK) and not os.access('/sbin/' + t, os.X_OK)]
    if missing:
        raise NamespaceError('cannot make namespaces: {} not installed (util-linux, iproute2)'.format(
            ', '.join(missing)))


def _children(pid):
    try:
        with open('/proc/{}/task/{}/children'.format(pid, pid)) as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []


class Namespaces:
    """The head's and the nodes' namespaces; run(name, argv) runs a command inside one."""

    def __init__(self, n_nodes):
        self.names = ['head'] + ['node{}'.format(i) for i in range(1, n_nodes + 1)]
        self._unshare = {}   # name -> Popen of unshare
        self.init_pid = {}   # name -> host PID of the namespace's init

    def make(self, name, flags):
        """Start namespace ``name`` with unshare ``flags`` (plus a PID namespace's init); wait for it."""
        # If this process dies without stop() (SIGKILL), setpriv's death signal kills unshare and
        # unshare's --kill-child kills the namespace's init: nothing of the cluster outlives us.
        guard = ['setpriv', '--pdeathsig', 'SIGKILL'] if shutil.which('setpriv') else []
        proc = subprocess.Popen(guard + ['unshare'] + flags + ['--fork', '--kill-child=SIGKILL',
                                                              '--mount-proc', '--propagation', 'private',
                                                              sys.executable, '-c', _INIT],
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, start_new_session=True)
        self._unshare[name] = proc
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            kids = _children(proc.pid)
            if kids:
                self.init_pid[name] = kids[0]
                return
            if proc.poll() is not None:
                raise NamespaceError('cannot make namespaces (unshare {} exited {}): {}'.format(
                    ' '.join(flags), proc.returncode, proc.stderr.read().decode(errors='replace').strip()))
            time.sleep(0.01)
        raise NamespaceError('unshare started no init within 20 s')

    def sh(self, name, ns_flags, script):
        """Run ``sh -ec script`` in the nsenter ``ns_flags`` namespaces of ``name``; raise on failure."""
        proc = subprocess.run(['nsenter', '-t', str(self.init_pid[name])] + ns_flags + ['sh', '-ec', script],
                              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        if proc.returncode != 0:
            raise NamespaceError('setting up {} failed: {}: {}'.format(
                name, script, proc.stderr.decode(errors='replace').strip()))

    def start(self):
        """Make the head (bridge) and every node (veth on the bridge); raise NamespaceError if impossible."""
        _tools()
        try:
            self.make('head', ['--net', '--uts', '--mount', '--pid'])
            self.sh('head', ['-u'], 'hostname head')
            self.sh('head', ['-n'], 'ip link set lo up; ip link add br0 type bridge; '
                     'ip addr add {}/24 dev br0; ip link set br0 up'.format(HEAD_ADDR))
            for i, name in enumerate(self.names[1:], 1):
                self.make(name, ['--net', '--uts', '--ipc', '--mount', '--pid'])
                self.sh(name, ['-u'], 'hostname ' + name)
                self.sh(name, ['-m'], 'mount -t tmpfs shm /dev/shm; mount -t tmpfs cgroup /sys/fs/cgroup')
                self.sh('head', ['-n'], 'ip link add v{0} type veth peer name eth0 netns {1}; '
                         'ip link set v{0} master br0 up'.format(name, self.init_pid[name]))
                self.sh(name, ['-n'], 'ip link set lo up; ip addr add {}/24 dev eth0; '
                         'ip link set eth0 up'.format(node_addr(i)))
        except BaseException:
            self.stop()
            raise
        return self

    def command(self, name, argv, cwd=None):
        """Return the argv that runs ``argv`` inside namespace ``name`` with working directory ``cwd``."""
        return ['nsenter', '-t', str(self.init_pid[name]), '-a', '--root', '--wd=' + (cwd or os.getcwd())] + list(argv)

    def run(self, name, argv, env=None, cwd=None, timeout=120, **kw):
        """Run ``argv`` inside ``name`` (extra ``env`` on top of ours); return CompletedProcess."""
        full = dict(os.environ, **(env or {}))
        kw.setdefault('stdout', subprocess.PIPE)
        kw.setdefault('stderr', subprocess.PIPE)
        return subprocess.run(self.command(name, argv, cwd), env=full, timeout=timeout,
                              stdin=subprocess.DEVNULL, **kw)

    def stop(self):
        """Kill every namespace's init (the kernel then kills the rest) and reap unshare."""
        for name, pid in list(self.init_pid.items()):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for proc in self._unshare.values():
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            if proc.stderr:
                proc.stderr.close()
        self.init_pid.clear()
        self._unshare.clear()


class LocalSlurmCluster:
    """A running one-machine Slurm cluster: ``srun(...)`` runs a job step from the head."""

    def __init__(self, namespaces, daemons, root):
        self.namespaces = namespaces
        self.daemons = daemons
        self.root = root
        self.nodes = daemons.nodes
        self.timings = daemons.timings

    def run(self, argv, env=None, cwd=None, timeout=120, **kw):
        """Run a command (srun, sbatch, scontrol, ...) on the head with SLURM_CONF set."""
        return self.namespaces.run('head', argv, env=dict(self.daemons.env(), **(env or {})),
                                   cwd=cwd, timeout=timeout, **kw)

    def srun(self, args, env=None, cwd=None, timeout=120, **kw):
        """Run ``srun ARGS`` on the head; return CompletedProcess (stdout/stderr as bytes)."""
        return self.run([self.daemons.programs['srun']] + list(args), env=env, cwd=cwd,
                        timeout=timeout, **kw)

    def log(self, name):
        """Return the text of a daemon log (``slurmctld``, ``slurmd-node1``, ``munged``), or ''."""
        try:
            with open(os.path.join(self.daemons.files.log_dir, name + '.log'), errors='replace') as f:
                return f.read()
        except OSError:
            return ''


@contextlib.contextmanager
def local_cluster(nodes=2, root=None, keep=False, timeout=60.0, **conf):
    """Start a Slurm cluster of ``nodes`` namespace nodes on this machine; remove it on exit.

    Raises SlurmError when Slurm is not installed and NamespaceError when namespaces cannot be
    made (not root, no unshare, a container without CAP_SYS_ADMIN). ``conf`` goes to write_config.
    """
    find_slurm()
    made_root = root is None
    root = root or tempfile.mkdtemp(prefix='chainermn-slurm-')
    ns = Namespaces(nodes)
    try:
        ns.start()
        node_list = [Node('node{}'.format(i), node_addr(i)) for i in range(1, nodes + 1)]
        files = write_config(root, node_list, head='head', head_addr=HEAD_ADDR, **conf)
        daemons = SlurmDaemons(files, node_list, lambda argv, **kw: ns.run('head', argv, **kw),
                               lambda name, argv, **kw: ns.run(name, argv, **kw))
        daemons.start(timeout=timeout)
        yield LocalSlurmCluster(ns, daemons, root)
    finally:
        ns.stop()
        if made_root and not keep:
            shutil.rmtree(root, ignore_errors=True)
