"""Move ndarrays between NumPy and the array module they came from (NumPy or CuPy)."""

import numpy

__all__ = ['is_array', 'as_host', 'like', 'array_module_of', 'describe']


def array_module_of(x):
    """Return ``numpy`` or ``cupy`` for ``x``."""
    mod = type(x).__module__
    if mod.startswith('cupy'):
        import cupy
        return cupy
    return numpy


def is_array(x):
    """Return True for NumPy and CuPy ndarrays."""
    return isinstance(x, numpy.ndarray) or type(x).__module__.startswith('cupy')


def _contiguous(a):
    # numpy.ascontiguousarray would turn a 0-d array into shape (1,); keep the shape.
    return a if a.flags.c_contiguous else a.copy(order='C')


def as_host(x):
    """Return ``x`` as a C-contiguous NumPy array of the same shape (copying from the GPU if needed)."""
    if isinstance(x, numpy.ndarray):
        return _contiguous(x)
    if type(x).__module__.startswith('cupy'):
        return _contiguous(numpy.asarray(x.get()))
    return _contiguous(numpy.asarray(x))


def like(host, template):
    """Return ``host`` on the same device type as ``template``."""
    if template is not None and type(template).__module__.startswith('cupy'):
        import cupy
        return cupy.asarray(host)
    return host


def describe(x):
    """Describe ``x`` for error messages."""
    if is_array(x):
        return '{} of shape {} and dtype {}'.format(type(x).__name__, x.shape, x.dtype)
    return 'object of type {}'.format(type(x).__name__)
