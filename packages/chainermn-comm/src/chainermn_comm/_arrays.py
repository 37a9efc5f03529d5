"""Move ndarrays between NumPy and the array module they came from (NumPy or CuPy)."""

import numpy

__all__ = ['is_array', 'is_device', 'as_host', 'like', 'to_device_if', 'array_module_of', 'describe',
           'check_current_device']


def is_device(x):
    """Return True for CuPy arrays."""
    return type(x).__module__.startswith('cupy')


def array_module_of(x):
    """Return ``numpy`` or ``cupy`` for ``x``."""
    if is_device(x):
        import cupy
        return cupy
    return numpy


def is_array(x):
    """Return True for NumPy and CuPy ndarrays."""
    return isinstance(x, numpy.ndarray) or is_device(x)


def check_current_device(x, what, rank):
    """Raise ValueError when CuPy array ``x`` lives on a device other than the current one."""
    if not is_device(x):
        return
    import cupy
    dev = cupy.cuda.runtime.getDevice()
    if x.device.id != dev:
        raise ValueError('rank {}: {} got a CuPy array on device {} but the current device is {}; '
                         'use cupy.cuda.Device(comm.intra_rank).use() and keep arrays there'.format(
                             rank, what, x.device.id, dev))


def _contiguous(a):
    # numpy.ascontiguousarray would turn a 0-d array into shape (1,); keep the shape.
    return a if a.flags.c_contiguous else a.copy(order='C')


def as_host(x):
    """Return ``x`` as a C-contiguous NumPy array of the same shape (copying from the GPU if needed)."""
    if isinstance(x, numpy.ndarray):
        return _contiguous(x)
    if is_device(x):
        return _contiguous(numpy.asarray(x.get()))
    return _contiguous(numpy.asarray(x))


def to_device_if(host, on_device):
    """Return ``host`` moved to the current GPU when ``on_device``, else unchanged."""
    if on_device:
        import cupy
        return cupy.asarray(host)
    return host


def like(host, template):
    """Return ``host`` on the same device type as ``template``."""
    return to_device_if(host, template is not None and is_device(template))


def describe(x):
    """Describe ``x`` for error messages."""
    if is_array(x):
        return '{} of shape {} and dtype {}'.format(type(x).__name__, x.shape, x.dtype)
    return 'object of type {}'.format(type(x).__name__)
