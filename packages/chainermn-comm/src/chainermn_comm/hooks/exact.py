"""The exact average as a hook: the gradients' own dtype on the wire (``allreduce_grad_dtype=None``)."""

from chainermn_comm.hooks.base import WireHook

__all__ = ['Exact']


class Exact(WireHook):
    """Average exactly, in the gradients' own dtype: the default path, as a hook."""

    def __init__(self):
        super().__init__(None)
