"""``chainermn.communicators.pure_nccl_communicator`` (v7's path): ``PureNcclCommunicator(mpi_comm)``."""

from chainermn_comm.gpu.pure_nccl import PureNcclCommunicator

__all__ = ['PureNcclCommunicator']
