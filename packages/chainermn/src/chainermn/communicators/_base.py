"""``chainermn.communicators._base.CommunicatorBase``: the path the reference uses in parameter types."""

from chainermn_comm import CommunicatorBase

__all__ = ['CommunicatorBase']
