"""``chainermn.communicators.dummy_communicator`` (v7's path): gradients not averaged, for measuring."""

from chainermn_comm.dummy import DummyCommunicator

__all__ = ['DummyCommunicator']
