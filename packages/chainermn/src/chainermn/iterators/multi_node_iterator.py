"""``chainermn.iterators.multi_node_iterator`` (v7's path): ``create_multi_node_iterator``."""

from chainermn_data import create_multi_node_iterator

__all__ = ['create_multi_node_iterator']
