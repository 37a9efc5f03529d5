"""Slurm on the namespace cluster of ``chainermn_tools.cluster``: slurmctld on the head, slurmd on every node."""

import contextlib
import shutil
import socket
import subprocess
import tempfile

from chainermn_tools.slurm._conf import Node, write_config
from chainermn_tools.slurm._daemons import SlurmDaemons, find_slurm
from chainermn_tools.slurm._head import Namespaces

__all__ = ['SlurmOnCluster', 'slurm_on']


class SlurmOnCluster:
    """Slurm daemons running on a started ``chainermn_tools.cluster.Cluster``.

    slurmctld and munged run on the head (this machine's network, where the cluster's bridge
    has ``cluster.head_address``) inside their own UTS/mount/PID namespaces named ``head``; each
    node gets a tmpfs over /sys/fs/cgroup and a slurmd.  ``run(argv)`` runs srun/sbatch/... there.
    """

    def __init__(self, cluster, root=None):
        self.cluster = cluster
        self._made_root = root is None
        self.root = root or tempfile.mkdtemp(prefix='chainermn-slurm-')
        self._head = Namespaces()
        self.daemons = None

    def start(self, timeout=60.0):
        """Start the head namespace, the cgroup tmpfs on every node and every daemon; return timings."""
        find_slurm()
        c = self.cluster
        self._head.make('head', ['--uts', '--mount', '--pid'])
        self._head.sh('head', ['-u'], 'hostname head')
        for node in c.nodes:
            proc = c.run(node, ['mount', '-t', 'tmpfs', 'cgroup', '/sys/fs/cgroup'])
            if proc.returncode != 0:
                raise RuntimeError('cannot mount a tmpfs over /sys/fs/cgroup on {}: {}'.format(
                    node.hostname, proc.stderr))
        nodes = [Node(n.hostname, n.address) for n in c.nodes]
        # slurmctld shares this machine's network: a free port, so clusters (and a real Slurm) coexist
        files = write_config(self.root, nodes, head='head', head_addr=c.head_address,
                             ctld_port=_free_port())
        by_name = {n.hostname: n for n in c.nodes}
        self.daemons = SlurmDaemons(
            files, nodes, lambda argv, **kw: self._head.run('head', argv, **kw),
            lambda name, argv, **kw: _as_bytes_run(c, by_name[name], argv, **kw))
        return self.daemons.start(timeout=timeout)

    def run(self, argv, env=None, cwd=None, timeout=120, **kw):
        """Run a Slurm client command (srun, sbatch, scontrol, ...) on the head."""
        return self._head.run('head', argv, env=dict(self.env(), **(env or {})), cwd=cwd,
                              timeout=timeout, **kw)

    def head_command(self, argv, cwd=None):
        """Return the argv that runs ``argv`` on the head (run it with ``env()``)."""
        return self._head.command('head', [str(a) for a in argv], cwd=cwd)

    def srun_command(self, argv, ranks_per_node=1, mpi='pmi2'):
        """Return the argv that runs ``argv`` as nodes x ``ranks_per_node`` tasks through srun."""
        n = len(self.cluster.nodes)
        return self.head_command([self.daemons.programs['srun'], '--mpi=' + mpi, '-N', str(n),
                                  '-n', str(n * ranks_per_node), '--ntasks-per-node',
                                  str(ranks_per_node)] + list(argv))

    def env(self):
        """Return the environment for srun_command(): the cluster's plus SLURM_CONF."""
        return dict(self.cluster.env(), **self.daemons.env())

    def signal_jobs(self, sig):
        """Send ``sig`` to every job step's tasks (``scancel --signal``), as a batch system would."""
        import getpass
        return self.run(['scancel', '--signal={}'.format(int(sig)), '--user=' + getpass.getuser()],
                        timeout=30)

    def stop(self):
        """Stop the daemons on the nodes, then the head namespace (munged, slurmctld); remove the files."""
        if self.daemons is not None:
            try:
                self.daemons.stop()
            except Exception:
                pass
        self._head.stop()
        if self._made_root:
            shutil.rmtree(self.root, ignore_errors=True)


def _free_port():
    with socket.socket() as s:
        s.bind(('', 0))
        return s.getsockname()[1]


def _as_bytes_run(cluster, node, argv, env=None, timeout=120, **kw):
    """Run ``argv`` on a cluster node with bytes output, as SlurmDaemons expects."""
    kw.setdefault('stdout', subprocess.PIPE)
    kw.setdefault('stderr', subprocess.PIPE)
    return subprocess.run(cluster.command(node, argv), env=cluster.env(env), timeout=timeout,
                          stdin=subprocess.DEVNULL, **kw)


@contextlib.contextmanager
def slurm_on(cluster, root=None, timeout=60.0):
    """Start Slurm on a started Cluster; stop it (and remove the files it made) on exit."""
    s = SlurmOnCluster(cluster, root)
    try:
        s.start(timeout=timeout)
        yield s
    finally:
        s.stop()
