"""``chainermn.links.n_step_rnn`` (v7's path): ``create_multi_node_n_step_rnn``."""

from chainermn_links.links import create_multi_node_n_step_rnn

__all__ = ['create_multi_node_n_step_rnn']
