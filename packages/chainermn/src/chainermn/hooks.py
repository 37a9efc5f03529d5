"""Communication hooks (``chainermn.hooks``), from chainermn-comm: what averages the gradients.

``chainermn.create_multi_node_optimizer(optimizer, comm, comm_hook=chainermn.hooks.PowerSGD(rank=4))``;
the built-in wires ``Exact``, ``Float16``, ``BFloat16``, ``Auto``; ``CommHook`` and ``mean`` for a
hook of your own (docs/communicators.md, "Communication hooks").
"""

from chainermn_comm import hooks as _impl
from chainermn_comm.hooks import *  # noqa: F401,F403

__all__ = list(_impl.__all__)
