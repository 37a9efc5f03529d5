"""``chainermn.functions.point_to_point_communication`` (v7's path): ``send``, ``recv`` and their nodes."""

from chainermn_links.functions.point_to_point import Recv, Send, recv, send

__all__ = ['Send', 'Recv', 'send', 'recv']
