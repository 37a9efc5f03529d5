"""Work out which ranks share a node (intra) and which node a rank is on (inter)."""

import collections

from chainermn_comm import settings
from chainermn_comm.protocol import RANKS_PER_NODE_ENV

__all__ = ['Topology', 'detect_topology', 'simulated', 'RANKS_PER_NODE_ENV']

Topology = collections.namedtuple(
    'Topology', ['node_id', 'intra_rank', 'intra_size', 'inter_rank', 'inter_size', 'hosts'])


def _simulated_node_size():
    """Return $CHAINERMN_RANKS_PER_NODE (simulated nodes of that many consecutive ranks), or None."""
    return settings.read(RANKS_PER_NODE_ENV)


def simulated():
    """Return True when $CHAINERMN_RANKS_PER_NODE simulates the nodes (host names are made up)."""
    return _simulated_node_size() is not None


def detect_topology(mpi_comm):
    """Return the Topology of ``mpi_comm`` by grouping ranks by host (one allgather)."""
    from mpi4py import MPI
    rank = mpi_comm.Get_rank()
    per_node = _simulated_node_size()
    if per_node is not None:
        keys = ['node{}'.format(r // per_node) for r in range(mpi_comm.Get_size())]
    else:
        keys = mpi_comm.allgather(MPI.Get_processor_name())
    order = list(collections.OrderedDict.fromkeys(keys))
    node_id = order.index(keys[rank])
    same_node = [r for r, k in enumerate(keys) if k == keys[rank]]
    return Topology(node_id=node_id, intra_rank=same_node.index(rank), intra_size=len(same_node),
                    inter_rank=node_id, inter_size=len(order), hosts=tuple(keys))
