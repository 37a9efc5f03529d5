"""NumPy-backed stand-in for the parts of CuPy chainermn uses (tests only; see ../README.md)."""

import functools

import numpy

from cupy import cuda  # NOQA: F401
from cupy import random  # NOQA: F401
from cupy._ndarray import ndarray, unwrap, wrap
from cupy._kernels import ElementwiseKernel, RawKernel

__all__ = ['ndarray', 'ElementwiseKernel', 'RawKernel', 'asarray', 'array', 'asnumpy',
           'ascontiguousarray', 'get_array_module', 'memoize']

__version__ = '13.0.0+fake'
#: Lets a test tell the stand-in from the real CuPy.
IS_FAKE = True


def asarray(a, dtype=None, order=None):
    """Return ``a`` on the current device (a copy when it is a host array)."""
    if isinstance(a, ndarray) and (dtype is None or numpy.dtype(dtype) == a.dtype):
        return a
    return wrap(numpy.array(unwrap(a), dtype=dtype, order=order or 'K', copy=True))


def array(obj, dtype=None, copy=True, order='K', ndmin=0):
    """Return a new device array holding ``obj``."""
    like = obj if isinstance(obj, ndarray) else None
    return wrap(numpy.array(unwrap(obj), dtype=dtype, copy=True, order=order, ndmin=ndmin), like=like)


def ascontiguousarray(a, dtype=None):
    """Return device array ``a`` itself when C-contiguous (and of ``dtype``), else a C-contiguous copy."""
    if not isinstance(a, ndarray):
        return asarray(numpy.ascontiguousarray(a, dtype=dtype))
    if a.flags.c_contiguous and (dtype is None or numpy.dtype(dtype) == a.dtype):
        return a
    return wrap(numpy.ascontiguousarray(a._a, dtype=dtype), like=a)


def asnumpy(a, stream=None):
    """Return a host copy of a device array (host arrays pass through)."""
    return a.get() if isinstance(a, ndarray) else numpy.asarray(a)


def get_array_module(*args):
    """Return this module when any argument is a device array, else NumPy."""
    import cupy
    return cupy if any(isinstance(a, ndarray) for a in args) else numpy


def memoize(for_each_device=False):
    """Cache a function's results by its arguments (and the current device when asked)."""
    def deco(fn):
        cache = {}

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            key = (cuda.runtime.getDevice() if for_each_device else None, args,
                   tuple(sorted(kwargs.items())))
            if key not in cache:
                cache[key] = fn(*args, **kwargs)
            return cache[key]
        return wrapper
    return deco


def __getattr__(name):
    """Dtypes come from NumPy; array functions run in NumPy on device memory and return device arrays.

    Ufuncs refuse host arrays, as CuPy's do; creation functions (``zeros``, ``arange``, ...)
    make arrays on the current device.
    """
    obj = getattr(numpy, name)
    if isinstance(obj, type) or not callable(obj):
        return obj
    strict = isinstance(obj, numpy.ufunc)

    @functools.wraps(obj)
    def call(*args, **kwargs):
        what = 'cupy.' + name if strict else None
        out = kwargs.get('out')
        result = obj(*unwrap(args, what), **{k: unwrap(v, what) for k, v in kwargs.items()})
        if out is not None:
            return out
        like = next((a for a in args if isinstance(a, ndarray)), None)
        return wrap(result, like=like) if isinstance(result, (numpy.ndarray, numpy.generic)) else result
    return call
