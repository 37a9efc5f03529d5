"""Multi-node links (``chainermn.links``), from chainermn-links.

``MultiNodeBatchNormalization``, ``create_mnbn_model``, ``create_multi_node_n_step_rnn`` and
``MultiNodeChainList``; v7's submodules (``batch_normalization``, ``create_mnbn_model``,
``multi_node_chain_list``, ``n_step_rnn``) hold the same objects.
"""

# v7's submodules first, so that the function ``create_mnbn_model`` below wins over its module's name.
from chainermn.links import (batch_normalization, create_mnbn_model,  # noqa: F401
                             multi_node_chain_list, n_step_rnn)
from chainermn_links import MultiNodeChainList  # noqa: E402
from chainermn_links import links as _impl  # noqa: E402
from chainermn_links.links import *  # noqa: F401,F403,E402

from chainermn._reexport import public_names  # noqa: E402

__all__ = sorted(set(public_names(_impl)) | {'MultiNodeChainList'})
