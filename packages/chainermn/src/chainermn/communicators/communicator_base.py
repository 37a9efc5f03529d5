"""``chainermn.communicators.communicator_base`` (v7's path): the interface every communicator implements."""

from chainermn_comm import CommunicatorBase

__all__ = ['CommunicatorBase']
