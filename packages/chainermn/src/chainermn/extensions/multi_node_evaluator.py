"""``chainermn.extensions.multi_node_evaluator`` (v7's path): the multi-node evaluators."""

from chainermn_train import create_multi_node_evaluator
from chainermn_train.extensions import GenericMultiNodeEvaluator

__all__ = ['GenericMultiNodeEvaluator', 'create_multi_node_evaluator']
