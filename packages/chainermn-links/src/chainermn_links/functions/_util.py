"""Helpers shared by the differentiable communication functions."""

import chainer
import numpy

__all__ = ['dummy_variable', 'as_variable_tuple', 'array_module', 'to_like', 'to_device_of',
           'zeros_like_spec', 'spec', 'cupy_if_available', 'delegate_array']


def array_module(x):
    """Return numpy or cupy for an array (or Variable)."""
    if isinstance(x, chainer.Variable):
        x = x.array
    return chainer.backend.get_array_module(x)


def dummy_variable():
    """Return a fresh leaf variable that needs a gradient, so a node always takes part in backward."""
    return chainer.Variable(numpy.zeros((), dtype=numpy.float32), requires_grad=True)


def delegate_array(xp, dtype=numpy.float32):
    """Return the data-less (0-dim zero) array a delegate variable holds."""
    dtype = numpy.dtype(dtype)
    if dtype.kind != 'f':
        dtype = numpy.dtype(numpy.float32)
    return xp.zeros((), dtype=dtype)


def as_variable_tuple(xs, what):
    """Return ``xs`` (a Variable, array, or tuple/list of them) as a tuple of Variables."""
    if isinstance(xs, (tuple, list)):
        items = list(xs)
    else:
        items = [xs]
    out = []
    for i, x in enumerate(items):
        if isinstance(x, chainer.Variable):
            out.append(x)
        elif chainer.backend.get_array_module(x) is not None and hasattr(x, 'shape') and hasattr(x, 'dtype'):
            out.append(chainer.Variable(x, requires_grad=False))
        else:
            raise TypeError('{} needs chainer.Variable or ndarray items; item {} is {}'.format(
                what, i, type(x).__name__))
    return tuple(out)


def spec(a):
    """Return (shape, dtype, array module) of an array."""
    return (a.shape, a.dtype, chainer.backend.get_array_module(a))


def zeros_like_spec(s):
    """Return zeros with the (shape, dtype, module) ``s``."""
    shape, dtype, xp = s
    return xp.zeros(shape, dtype=dtype)


def cupy_if_available():
    """Return the cupy module, or None when CuPy cannot be imported."""
    try:
        import cupy
    except Exception:
        return None
    return cupy


def to_device_of(a, template_xp):
    """Return array ``a`` moved to ``template_xp`` (numpy or cupy; the current CUDA device for cupy)."""
    if a is None:
        return None
    if template_xp is numpy:
        if isinstance(a, numpy.ndarray):
            return a
        return chainer.backends.cuda.to_cpu(a)
    return template_xp.asarray(a)


def to_like(a, template):
    """Return ``a`` on the device and with the dtype of array ``template``."""
    a = to_device_of(a, chainer.backend.get_array_module(template))
    if a.dtype != template.dtype:
        a = a.astype(template.dtype)
    return a
