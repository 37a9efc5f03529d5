"""A Slurm cluster on one machine: Slurm's daemons on a namespace cluster of ``chainermn_tools.cluster``.

The nodes (hostnames node0, node1, ...; each with its own network, UTS, IPC, mount and PID
namespaces, on a bridge of its own /24 of 198.18.0.0/15) come from ``Cluster``, the one
namespace-cluster builder; slurmctld and munged run on the head (``SlurmOnCluster``: this machine's
network, at the bridge address ``head_address``).  Nothing touches the host's cgroups or daemons,
and leaving the context removes every namespace, link and process.  Needs root.
"""

import contextlib
import os
import shutil
import tempfile

from chainermn_tools.cluster import Cluster, ClusterUnavailable
from chainermn_tools.slurm._daemons import find_slurm
from chainermn_tools.slurm._head import NamespaceError
from chainermn_tools.slurm._on_cluster import SlurmOnCluster

__all__ = ['LocalSlurmCluster', 'local_cluster']


class LocalSlurmCluster:
    """A running one-machine Slurm cluster: ``srun(...)`` runs a job step from the head."""

    def __init__(self, cluster, slurm, root):
        self.cluster = cluster
        self.slurm = slurm
        self.daemons = slurm.daemons
        self.root = root
        self.nodes = slurm.daemons.nodes
        self.timings = slurm.daemons.timings
        #: Address of the head on the nodes' bridge (e.g. for ``mpiexec -localhost``).
        self.head_address = cluster.head_address

    def command(self, argv, cwd=None):
        """Return the argv that runs ``argv`` on the head (add ``daemons.env()`` to its environment)."""
        return self.slurm.head_command(argv, cwd=cwd)

    def run(self, argv, env=None, cwd=None, timeout=120, **kw):
        """Run a command (srun, sbatch, scontrol, ...) on the head with SLURM_CONF set."""
        return self.slurm.run(argv, env=env, cwd=cwd, timeout=timeout, **kw)

    def srun(self, args, env=None, cwd=None, timeout=120, **kw):
        """Run ``srun ARGS`` on the head; return CompletedProcess (stdout/stderr as bytes)."""
        return self.run([self.daemons.programs['srun']] + list(args), env=env, cwd=cwd,
                        timeout=timeout, **kw)

    def log(self, name):
        """Return the text of a daemon log (``slurmctld``, ``slurmd-node0``, ``munged``), or ''."""
        try:
            with open(os.path.join(self.daemons.files.log_dir, name + '.log'), errors='replace') as f:
                return f.read()
        except OSError:
            return ''


@contextlib.contextmanager
def local_cluster(nodes=2, root=None, keep=False, timeout=60.0):
    """Start a Slurm cluster of ``nodes`` namespace nodes on this machine; remove it on exit.

    Raises SlurmError when Slurm is not installed and NamespaceError when namespaces cannot be
    made (not root, no unshare, a container without CAP_SYS_ADMIN).
    """
    find_slurm()
    made_root = root is None
    root = root or tempfile.mkdtemp(prefix='chainermn-slurm-')
    cluster = Cluster(nodes=nodes)
    slurm = None
    try:
        try:
            cluster.start()
        except ClusterUnavailable as e:
            if isinstance(e, NamespaceError):
                raise
            raise NamespaceError(str(e)) from e
        slurm = SlurmOnCluster(cluster, root=root)
        slurm.start(timeout=timeout)
        yield LocalSlurmCluster(cluster, slurm, root)
    finally:
        if slurm is not None:
            slurm.stop()
        cluster.close()
        if made_root and not keep:
            shutil.rmtree(root, ignore_errors=True)
