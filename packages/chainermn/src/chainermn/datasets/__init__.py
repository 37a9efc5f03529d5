"""Dataset utilities (``chainermn.datasets``), from chainermn-data.

``create_empty_dataset``, ``scatter_dataset`` (also at ``chainermn.scatter_dataset``), and v7's
``scatter_index`` and ``DataSizeError``; v7's submodules ``scatter`` and ``empty_dataset``.
"""

from chainermn.datasets import empty_dataset, scatter  # noqa: F401
from chainermn_data import datasets as _impl
from chainermn_data import scatter_dataset
from chainermn_data.datasets import *  # noqa: F401,F403
from chainermn_data.scatter_index import DataSizeError, scatter_index

from chainermn import _reexport

__all__ = sorted(set(_reexport.public_names(_impl)) | {'scatter_dataset', 'scatter_index',
                                                       'DataSizeError'})
