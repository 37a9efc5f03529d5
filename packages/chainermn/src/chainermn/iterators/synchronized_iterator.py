"""``chainermn.iterators.synchronized_iterator`` (v7's path): ``create_synchronized_iterator``."""

from chainermn_data import create_synchronized_iterator

__all__ = ['create_synchronized_iterator']
