"""Differentiable communication functions (``chainermn.functions``)."""

from chainermn_links.functions.collective import allgather, alltoall, bcast, gather, scatter
from chainermn_links.functions.point_to_point import recv, send
from chainermn_links.functions.pseudo_connect import pseudo_connect

__all__ = ['send', 'recv', 'pseudo_connect', 'bcast', 'gather', 'scatter', 'alltoall', 'allgather']
