"""The flat communicator: MPI only, on device buffers when MPI is CUDA-aware, else host staging."""

from chainermn_comm.gpu._base import GpuCommunicatorBase

__all__ = ['FlatCommunicator']


class FlatCommunicator(GpuCommunicatorBase):
    """All-reduce packed gradients with one MPI call per buffer (no NCCL)."""

    name = 'flat'
