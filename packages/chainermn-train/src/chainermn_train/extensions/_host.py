"""Bring an observed value to host memory without naming a ChainerX device."""

import chainer
import numpy

__all__ = ['to_host']


def to_host(value):
    """Return ``value`` (Variable, NumPy/CuPy array or Python number) as a host value."""
    if isinstance(value, chainer.Variable):
        value = value.array
    if isinstance(value, numpy.ndarray) or numpy.isscalar(value):
        return value
    # CuPy or another device array: through the CPU device, which works on builds without ChainerX.
    return chainer.backend.CpuDevice().send(value)
