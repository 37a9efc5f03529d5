"""``chainermn.links.batch_normalization`` (v7's path): ``MultiNodeBatchNormalization``."""

from chainermn_links.links import MultiNodeBatchNormalization

__all__ = ['MultiNodeBatchNormalization']
