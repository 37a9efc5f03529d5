"""Trainer extensions (``chainermn.extensions``), from chainermn-train.

``AllreducePersistent``, the multi-node checkpointer and evaluator factories (also at the top
level: ``chainermn.create_multi_node_checkpointer`` and ``chainermn.create_multi_node_evaluator``),
and the extensions of later ChainerMN versions: ``multi_node_snapshot``,
``MultiNodeEarlyStoppingTrigger``, ``ObservationAggregator`` and ``GenericMultiNodeEvaluator``;
v7's submodules (``checkpoint``, ``multi_node_evaluator``, ...) hold the same objects.
"""

from chainermn.extensions import (allreduce_persistent, checkpoint,  # noqa: F401
                                  multi_node_early_stopping_trigger, multi_node_evaluator,
                                  observation_aggregator)

from chainermn_train import (create_multi_node_checkpoint, create_multi_node_checkpointer,
                             create_multi_node_evaluator)
from chainermn_train import extensions as _impl
from chainermn_train.extensions import *  # noqa: F401,F403

from chainermn import _reexport

__all__ = sorted(set(_reexport.public_names(_impl)) | {'create_multi_node_checkpoint',
                                               'create_multi_node_checkpointer',
                                               'create_multi_node_evaluator'})
