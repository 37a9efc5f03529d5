"""``chainermn.optimizers`` (v7's path): ``create_multi_node_optimizer``, from chainermn-train."""

from chainermn_train import create_multi_node_optimizer

__all__ = ['create_multi_node_optimizer']
