"""``chainermn.extensions.checkpoint`` (v7's path): ``create_multi_node_checkpointer``."""

from chainermn_train import create_multi_node_checkpointer

__all__ = ['create_multi_node_checkpointer']
