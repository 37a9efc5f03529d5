"""ChainerMN multi-node optimizer, evaluator, trainer extensions and checkpoints."""

from chainermn_train import _interrupt, extensions  # noqa: F401 (_interrupt: the Ctrl-C report's checkpoint)
from chainermn_train._evaluator import create_multi_node_evaluator
from chainermn_train._fingerprint import IdenticalBatchesWarning, ParameterMismatchWarning
from chainermn_train._optimizer import MultiNodeOptimizer, create_multi_node_optimizer
from chainermn_train.extensions import (AllreducePersistent, create_multi_node_checkpoint,
                                        create_multi_node_checkpointer)

__version__ = '2.0.0'

__all__ = ['create_multi_node_optimizer', 'create_multi_node_evaluator', 'MultiNodeOptimizer',
           'AllreducePersistent', 'create_multi_node_checkpointer', 'create_multi_node_checkpoint',
           'ParameterMismatchWarning', 'IdenticalBatchesWarning', 'extensions', '__version__']
