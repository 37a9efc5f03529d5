"""Differentiable communication functions (``chainermn.functions``), from chainermn-links.

``send``, ``recv``, ``pseudo_connect``, ``bcast``, ``gather``, ``scatter``, ``alltoall``,
``allgather``; v7's submodules (``collective_communication``, ``point_to_point_communication``,
``pseudo_connect``, ``batch_normalization``) hold the same objects.
"""

# v7's submodules first, so that the function ``pseudo_connect`` below wins over its module's name.
from chainermn.functions import (batch_normalization, collective_communication,  # noqa: F401
                                 point_to_point_communication, pseudo_connect)
from chainermn_links import functions as _impl
from chainermn_links.functions import *  # noqa: F401,F403,E402

from chainermn import _reexport  # noqa: E402

__all__ = _reexport.public_names(_impl)
