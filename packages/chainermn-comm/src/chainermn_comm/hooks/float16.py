"""The float16 wire as a hook (``allreduce_grad_dtype=numpy.float16``)."""

import numpy

from chainermn_comm.hooks.base import WireHook

__all__ = ['Float16']


class Float16(WireHook):
    """Average with float16 terms on the wire, each array scaled by a power of two, summed in float32."""

    def __init__(self):
        super().__init__(numpy.float16)
