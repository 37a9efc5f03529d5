"""``chainermn.communicators.naive_communicator`` (v7's path): ``NaiveCommunicator(mpi_comm)``."""

from chainermn_comm import NaiveCommunicator

__all__ = ['NaiveCommunicator']
