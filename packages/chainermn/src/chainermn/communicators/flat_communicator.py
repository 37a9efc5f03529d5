"""``chainermn.communicators.flat_communicator`` (v7's path): ``FlatCommunicator(mpi_comm)`` (GPUs)."""

from chainermn_comm.gpu.flat import FlatCommunicator

__all__ = ['FlatCommunicator']
