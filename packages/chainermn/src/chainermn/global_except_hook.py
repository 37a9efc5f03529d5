"""Abort the whole MPI job when one rank dies of an uncaught exception (``chainermn.global_except_hook``).

``add_hook()`` installs it; ``CHAINERMN_FORCE_ABORT_ON_EXCEPTION=1`` installs it when chainermn is
imported; ``python -m mpi4py script.py`` does the same from outside.  Implemented in chainermn-comm.
"""

from chainermn_comm import global_except_hook as _impl
from chainermn_comm.global_except_hook import *  # noqa: F401,F403

from chainermn import _reexport

__all__ = _reexport.public_names(_impl)
