"""``chainermn.functions.collective_communication`` (v7's path): the collectives and their nodes."""

from chainermn_links.functions.collective import (AllGather, AllToAll, Bcast, Gather, Scatter, allgather,
                                                  alltoall, bcast, gather, scatter)

__all__ = ['AllGather', 'AllToAll', 'Bcast', 'Gather', 'Scatter', 'allgather', 'alltoall', 'bcast', 'gather',
           'scatter']
