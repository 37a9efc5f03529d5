"""Multi-node iterators (``chainermn.iterators``), from chainermn-data.

``create_multi_node_iterator``, ``create_synchronized_iterator`` and ``create_elastic_iterator``;
v7's submodules ``multi_node_iterator`` and ``synchronized_iterator``.
"""

from chainermn.iterators import multi_node_iterator, synchronized_iterator  # noqa: F401

from chainermn_data import iterators as _impl
from chainermn_data.iterators import *  # noqa: F401,F403

from chainermn._reexport import public_names

__all__ = public_names(_impl)
