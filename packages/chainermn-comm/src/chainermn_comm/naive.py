"""The naive communicator: plain MPI on host memory, works on CPU and GPU arrays."""

from chainermn_comm._mpi_base import MpiCommunicatorBase

__all__ = ['NaiveCommunicator']


class NaiveCommunicator(MpiCommunicatorBase):
    """Communicator that runs every operation over MPI (GPU arrays go through host memory)."""

    name = 'naive'
