"""Slurm for tests and demos: write a configuration, run its daemons, build a cluster on one machine.

``write_config`` writes slurm.conf/cgroup.conf/MUNGE key under one directory; ``SlurmDaemons``
starts munged + slurmctld on a head and slurmd on every node through callables that run a
command inside each (namespaces, ssh, ...); ``slurm_on``/``SlurmOnCluster`` run them on a
``chainermn_tools.cluster.Cluster``, the one namespace-cluster builder (``python -m chainermn
cluster --slurm``); ``local_cluster`` builds that cluster and starts Slurm on it.  ``allocation``
(used by ``python -m chainermn doctor``) reads what Slurm told a process about its job, step and PMI.
"""

from chainermn_tools.slurm._conf import Node, SlurmFiles, write_config
from chainermn_tools.slurm._env import allocation, pmi_in_use
from chainermn_tools.slurm._daemons import MISSING_HINT, SlurmDaemons, SlurmError, find_slurm
from chainermn_tools.slurm._head import Namespaces, NamespaceError
from chainermn_tools.slurm._on_cluster import SlurmOnCluster, slurm_on
from chainermn_tools.slurm._local import LocalSlurmCluster, local_cluster

__all__ = ['Node', 'SlurmFiles', 'write_config', 'SlurmDaemons', 'SlurmError', 'find_slurm',
           'MISSING_HINT', 'Namespaces', 'NamespaceError', 'LocalSlurmCluster', 'local_cluster',
           'allocation', 'pmi_in_use', 'SlurmOnCluster', 'slurm_on']
