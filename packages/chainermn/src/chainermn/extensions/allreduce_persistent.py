"""``chainermn.extensions.allreduce_persistent`` (v7's path): ``AllreducePersistent``."""

from chainermn_train.extensions import AllreducePersistent

__all__ = ['AllreducePersistent']
