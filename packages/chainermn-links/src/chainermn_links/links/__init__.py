"""Multi-node links (``chainermn.links``)."""

from chainermn_links.links.batch_normalization import MultiNodeBatchNormalization
from chainermn_links.links.create_mnbn_model import create_mnbn_model

__all__ = ['MultiNodeBatchNormalization', 'create_mnbn_model']
