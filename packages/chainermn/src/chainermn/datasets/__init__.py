"""Dataset utilities (``chainermn.datasets``), from chainermn-data.

``create_empty_dataset``, plus ``scatter_dataset`` (also at ``chainermn.scatter_dataset``).
"""

from chainermn_data import datasets as _impl
from chainermn_data import scatter_dataset
from chainermn_data.datasets import *  # noqa: F401,F403

from chainermn import _reexport

__all__ = sorted(set(_reexport.public_names(_impl)) | {'scatter_dataset'})
