"""Differentiable communication functions (``chainermn.functions``), from chainermn-links.

``send``, ``recv``, ``pseudo_connect``, ``bcast``, ``gather``, ``scatter``, ``alltoall``,
``allgather``.
"""

from chainermn_links import functions as _impl
from chainermn_links.functions import *  # noqa: F401,F403

from chainermn import _reexport

__all__ = _reexport.public_names(_impl)
