"""Multi-node links (``chainermn.links``), from chainermn-links.

``MultiNodeBatchNormalization``, ``create_mnbn_model``, ``create_multi_node_n_step_rnn`` and
``MultiNodeChainList``.
"""

from chainermn_links import MultiNodeChainList
from chainermn_links import links as _impl
from chainermn_links.links import *  # noqa: F401,F403

from chainermn._reexport import public_names

__all__ = sorted(set(public_names(_impl)) | {'MultiNodeChainList'})
