"""chainermn-data: scatter a dataset from root to every rank, and multi-node iterators."""

from chainermn_data import datasets
from chainermn_data import iterators
from chainermn_data._scatter import scatter_dataset
from chainermn_data.datasets import create_empty_dataset
from chainermn_data.iterators import create_multi_node_iterator, create_synchronized_iterator

__all__ = ['scatter_dataset', 'create_empty_dataset', 'create_multi_node_iterator',
           'create_synchronized_iterator', 'datasets', 'iterators']
