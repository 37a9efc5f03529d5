"""``chainermn.extensions.multi_node_early_stopping_trigger`` (v7's path): ``MultiNodeEarlyStoppingTrigger``."""

from chainermn_train.extensions import MultiNodeEarlyStoppingTrigger

__all__ = ['MultiNodeEarlyStoppingTrigger']
