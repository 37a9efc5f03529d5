"""Trainer extensions of ChainerMN: AllreducePersistent and the multi-node checkpointer."""

from chainermn_train.extensions._allreduce_persistent import AllreducePersistent
from chainermn_train.extensions._checkpoint import (CheckpointWarning, MultiNodeCheckpointer,
                                                    UnsafeCheckpointError, create_multi_node_checkpoint,
                                                    create_multi_node_checkpointer)

__all__ = ['AllreducePersistent', 'MultiNodeCheckpointer', 'create_multi_node_checkpointer',
           'create_multi_node_checkpoint', 'CheckpointWarning', 'UnsafeCheckpointError']
