"""``chainermn.datasets.empty_dataset`` (v7's path): ``create_empty_dataset``."""

from chainermn_data import create_empty_dataset

__all__ = ['create_empty_dataset']
