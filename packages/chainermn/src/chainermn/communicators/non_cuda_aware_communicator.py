"""``chainermn.communicators.non_cuda_aware_communicator`` (v7's path): ``NonCudaAwareCommunicator(mpi_comm)``."""

from chainermn_comm.gpu.hierarchical import NonCudaAwareCommunicator

__all__ = ['NonCudaAwareCommunicator']
