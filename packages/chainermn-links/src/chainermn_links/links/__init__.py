"""Multi-node links (``chainermn.links``)."""

from chainermn_links.links.batch_normalization import MultiNodeBatchNormalization
from chainermn_links.links.create_mnbn_model import create_mnbn_model
from chainermn_links.links.n_step_rnn import create_multi_node_n_step_rnn

__all__ = ['MultiNodeBatchNormalization', 'create_mnbn_model', 'create_multi_node_n_step_rnn']
