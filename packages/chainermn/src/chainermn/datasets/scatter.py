"""``chainermn.datasets.scatter`` (v7's path): ``scatter_dataset``, ``scatter_index`` and v7's helpers."""

from chainermn_data import scatter_dataset
from chainermn_data.scatter_index import (DataSizeError, get_epoch_trigger,
                                          get_n_iterations_for_one_epoch, scatter_index)

__all__ = ['DataSizeError', 'scatter_dataset', 'scatter_index', 'get_n_iterations_for_one_epoch',
           'get_epoch_trigger']
