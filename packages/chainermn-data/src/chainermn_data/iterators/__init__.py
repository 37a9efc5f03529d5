"""Iterators for data-parallel and model-parallel training over MPI."""

from chainermn_data.iterators._elastic import ElasticIterator, create_elastic_iterator
from chainermn_data.iterators._errors import IteratorMismatchError
from chainermn_data.iterators._multi_node import MultiNodeIterator, create_multi_node_iterator
from chainermn_data.iterators._synchronized import create_synchronized_iterator

__all__ = ['create_multi_node_iterator', 'create_synchronized_iterator', 'create_elastic_iterator',
           'MultiNodeIterator', 'ElasticIterator', 'IteratorMismatchError']
