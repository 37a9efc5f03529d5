"""Trainer extensions of ChainerMN: persistents, checkpoints, snapshots, evaluation, early stopping."""

from chainermn_train._fingerprint import ParameterMismatchWarning
from chainermn_train.checkpoint import (CheckpointInUseError, CheckpointWarning,
                                        MultiNodeCheckpointer, SnapshotUnusableError,
                                        UnsafeCheckpointError, create_multi_node_checkpoint,
                                        create_multi_node_checkpointer, multi_node_snapshot)
from chainermn_train.extensions._allreduce_persistent import AllreducePersistent
from chainermn_train.extensions._early_stopping import MultiNodeEarlyStoppingTrigger
from chainermn_train.extensions._generic_evaluator import GenericMultiNodeEvaluator
from chainermn_train.extensions._observation_aggregator import ObservationAggregator

__all__ = ['AllreducePersistent', 'MultiNodeCheckpointer', 'create_multi_node_checkpointer',
           'create_multi_node_checkpoint', 'CheckpointWarning', 'SnapshotUnusableError',
           'UnsafeCheckpointError', 'CheckpointInUseError', 'ParameterMismatchWarning',
           'GenericMultiNodeEvaluator', 'MultiNodeEarlyStoppingTrigger', 'ObservationAggregator',
           'multi_node_snapshot']
