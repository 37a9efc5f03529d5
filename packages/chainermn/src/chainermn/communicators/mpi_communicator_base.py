"""``chainermn.communicators.mpi_communicator_base`` (v7's path): the MPI communicator to subclass."""

from chainermn_comm import MpiCommunicatorBase

__all__ = ['MpiCommunicatorBase']
