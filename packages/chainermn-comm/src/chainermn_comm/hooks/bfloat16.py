"""The bfloat16 wire as a hook (``allreduce_grad_dtype='bfloat16'``)."""

from chainermn_comm.hooks.base import WireHook

__all__ = ['BFloat16']


class BFloat16(WireHook):
    """Average with bfloat16 terms on the wire (float32's range, 8-bit significand), summed in float32."""

    def __init__(self):
        super().__init__('bfloat16')
