"""A cluster on one machine: nodes made of Linux namespaces, MPI across them, for tests and users.

``python -m chainermn cluster --nodes N --ranks-per-node K [--link-gbit R] -- COMMAND ARGS...``
(see ``chainermn_tools.cluster._cli``), or in Python::

    with Cluster(nodes=2) as cluster:
        res = cluster.mpiexec(['train.py'], ranks_per_node=2)
"""

from chainermn_tools.cluster._cluster import NODE_LOCAL_ENV, Cluster, Node
from chainermn_tools.cluster._support import ClusterUnavailable, missing

__all__ = ['Cluster', 'ClusterUnavailable', 'Node', 'NODE_LOCAL_ENV', 'missing']
