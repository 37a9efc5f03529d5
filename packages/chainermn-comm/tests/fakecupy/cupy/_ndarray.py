"""The stand-in ``cupy.ndarray``: NumPy memory behind an object that is *not* a ``numpy.ndarray``.

Like CuPy's, it refuses implicit host conversion (``numpy.asarray(x)``, ``host[...] = x``,
``x[...] = host``, ufuncs mixing it with host arrays), remembers the device it was made on,
and offers ``__cuda_array_interface__`` only when ``$CUPY_FAKE_MPI_CUDA_AWARE=1``, so that a
device array handed to an MPI that is not CUDA-aware fails loudly in mpi4py.
"""

import ctypes
import operator
import os

import numpy

__all__ = ['ndarray', 'wrap', 'unwrap', 'MemoryPointer', 'host_view']


class MemoryPointer:
    """What ``ndarray.data`` returns: the address of the first element."""

    __slots__ = ('ptr',)

    def __init__(self, ptr):
        self.ptr = int(ptr)


def _current_device():
    from cupy.cuda import runtime
    return runtime.getDevice()


def _is_host_array(x):
    return isinstance(x, numpy.ndarray) and x.ndim > 0


def unwrap(x, what=None):
    """Return ``x`` with device arrays replaced by their NumPy memory; reject host arrays if ``what``."""
    if isinstance(x, ndarray):
        return x._a
    if isinstance(x, (tuple, list)):
        return type(x)(unwrap(v, what) for v in x)
    if what is not None and _is_host_array(x):
        raise TypeError('fake cupy: {} mixes a device array with a host numpy.ndarray of shape {} '
                        '(CuPy refuses implicit host/device conversion)'.format(what, x.shape))
    return x


def wrap(x, like=None):
    """Return NumPy result ``x`` as a device array (0-d for scalars, as CuPy returns)."""
    if isinstance(x, ndarray):
        return x
    arr = numpy.asarray(x)
    return ndarray._from(arr, like._dev if like is not None else _current_device())


def host_view(ptr, nbytes, dtype):
    """Return a writable NumPy view of ``nbytes`` at address ``ptr`` as ``dtype``."""
    dt = numpy.dtype(dtype)
    if nbytes == 0:
        return numpy.empty(0, dt)
    raw = (ctypes.c_char * nbytes).from_address(int(ptr))
    return numpy.frombuffer(raw, dtype=numpy.uint8).view(dt)


def _binary(ufunc, reflected=False):
    def op(self, other):
        if reflected:
            return ufunc(other, self)
        return ufunc(self, other)
    return op


def _inplace(ufunc):
    def op(self, other):
        ufunc(self, other, out=self)
        return self
    return op


class ndarray:
    """Device array stand-in: ``_a`` is the NumPy memory, ``_dev`` the device id."""

    __slots__ = ('_a', '_dev', '__weakref__')
    __array_priority__ = 100

    def __init__(self, shape, dtype=float, memptr=None, strides=None, order='C'):
        self._a = numpy.empty(shape, dtype=dtype, order=order)
        self._dev = _current_device()

    @classmethod
    def _from(cls, arr, dev):
        self = cls.__new__(cls)
        self._a = arr
        self._dev = dev
        return self

    def _wrap(self, x):
        if isinstance(x, (numpy.ndarray, numpy.generic)):
            return ndarray._from(numpy.asarray(x), self._dev)
        return x

    # -- attributes ----------------------------------------------------------
    shape = property(lambda self: self._a.shape)
    dtype = property(lambda self: self._a.dtype)
    size = property(lambda self: self._a.size)
    ndim = property(lambda self: self._a.ndim)
    itemsize = property(lambda self: self._a.itemsize)
    nbytes = property(lambda self: self._a.nbytes)
    strides = property(lambda self: self._a.strides)
    flags = property(lambda self: self._a.flags)
    T = property(lambda self: self._wrap(self._a.T))

    @property
    def device(self):
        from cupy.cuda import Device
        return Device(self._dev)

    @property
    def data(self):
        return MemoryPointer(self._a.__array_interface__['data'][0])

    @property
    def __cuda_array_interface__(self):
        if os.environ.get('CUPY_FAKE_MPI_CUDA_AWARE', '0') != '1':
            raise AttributeError('fake cupy: this run emulates an MPI that is not CUDA-aware; a device '
                                 'array must not be handed to MPI (set CUPY_FAKE_MPI_CUDA_AWARE=1 to allow)')
        a = self._a
        return {'shape': a.shape, 'typestr': a.dtype.str, 'version': 3, 'stream': None,
                'data': (a.__array_interface__['data'][0], False),
                'strides': None if a.flags.c_contiguous else a.strides}

    # -- conversions -----------------------------------------------------------
    def __array__(self, dtype=None, copy=None):
        raise TypeError('Implicit conversion to a NumPy array is not allowed. Please use `.get()` to '
                        'construct a NumPy array explicitly.')

    def get(self, stream=None, order='C', out=None):
        """Return a host copy."""
        host = numpy.array(self._a, copy=True, order=order)
        if out is not None:
            out[...] = host
            return out
        return host

    def set(self, arr, stream=None):
        """Copy host ``arr`` in (same shape and dtype, as CuPy requires)."""
        if not isinstance(arr, numpy.ndarray):
            raise TypeError('fake cupy: set() takes a host numpy.ndarray; got {}'.format(type(arr)))
        if arr.dtype != self.dtype:
            raise TypeError('fake cupy: set() dtype mismatch: {} into {}'.format(arr.dtype, self.dtype))
        if arr.shape != self.shape:
            raise ValueError('fake cupy: set() shape mismatch: {} into {}'.format(arr.shape, self.shape))
        self._a[...] = arr

    def tolist(self):
        return self._a.tolist()

    def item(self, *args):
        return self._a.item(*args)

    def __float__(self):
        return float(self._a)

    def __int__(self):
        return int(self._a)

    def __index__(self):
        return operator.index(self._a)

    def __bool__(self):
        return bool(self._a)

    def __len__(self):
        return len(self._a)

    def __iter__(self):
        for row in self._a:
            yield self._wrap(row)

    def __repr__(self):
        return 'fake_cupy.' + repr(self._a)

    __str__ = __repr__

    def __reduce__(self):
        from cupy import array
        return (array, (self.get(),))

    # -- shape and copies --------------------------------------------------------
    def reshape(self, *shape, order='C'):
        return self._wrap(self._a.reshape(*shape, order=order))

    def ravel(self, order='C'):
        return self._wrap(self._a.ravel(order))

    def view(self, dtype=None):
        return self._wrap(self._a.view(dtype) if dtype is not None else self._a.view())

    def astype(self, dtype, order='K', casting=None, subok=None, copy=True):
        return self._wrap(self._a.astype(dtype, order=order, copy=copy))

    def copy(self, order='C'):
        return self._wrap(self._a.copy(order=order))

    def fill(self, value):
        if _is_host_array(value) or isinstance(value, ndarray) and value.ndim:
            raise ValueError('non-scalar numpy.ndarray cannot be used for fill')
        self._a.fill(unwrap(value))

    def transpose(self, *axes):
        return self._wrap(self._a.transpose(*axes))

    def squeeze(self, axis=None):
        return self._wrap(self._a.squeeze(axis))

    def __getitem__(self, index):
        return self._wrap(self._a[unwrap(index, 'indexing')])

    def __setitem__(self, index, value):
        if _is_host_array(value):
            raise ValueError('non-scalar numpy.ndarray cannot be used for fill')
        self._a[unwrap(index, 'indexing')] = unwrap(value)

    # -- reductions ----------------------------------------------------------------
    def _reduce(name):
        def method(self, *args, **kwargs):
            return self._wrap(getattr(self._a, name)(*unwrap(args), **unwrap(kwargs)))
        method.__name__ = name
        return method

    sum = _reduce('sum')
    max = _reduce('max')
    min = _reduce('min')
    mean = _reduce('mean')
    prod = _reduce('prod')
    any = _reduce('any')
    all = _reduce('all')
    argmax = _reduce('argmax')
    argmin = _reduce('argmin')
    del _reduce

    # -- NumPy protocols ---------------------------------------------------------------
    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        what = '{}.{}'.format(ufunc.__name__, method)
        out = kwargs.get('out', ())
        args = unwrap(inputs, what)
        kw = {k: unwrap(v, what) for k, v in kwargs.items()}
        result = getattr(ufunc, method)(*args, **kw)
        if out:
            return out[0] if len(out) == 1 else out
        if isinstance(result, tuple):
            return tuple(self._wrap(r) for r in result)
        return self._wrap(result)

    def __array_function__(self, func, types, args, kwargs):
        what = func.__name__
        result = func(*unwrap(args, what), **{k: unwrap(v, what) for k, v in kwargs.items()})
        if isinstance(result, (tuple, list)):
            return type(result)(self._wrap(r) for r in result)
        return self._wrap(result)

    __add__, __radd__ = _binary(numpy.add), _binary(numpy.add, True)
    __sub__, __rsub__ = _binary(numpy.subtract), _binary(numpy.subtract, True)
    __mul__, __rmul__ = _binary(numpy.multiply), _binary(numpy.multiply, True)
    __truediv__, __rtruediv__ = _binary(numpy.true_divide), _binary(numpy.true_divide, True)
    __floordiv__, __rfloordiv__ = _binary(numpy.floor_divide), _binary(numpy.floor_divide, True)
    __mod__, __pow__ = _binary(numpy.remainder), _binary(numpy.power)
    __matmul__ = _binary(numpy.matmul)
    __and__, __or__, __xor__ = _binary(numpy.bitwise_and), _binary(numpy.bitwise_or), _binary(numpy.bitwise_xor)
    __eq__, __ne__ = _binary(numpy.equal), _binary(numpy.not_equal)
    __lt__, __le__ = _binary(numpy.less), _binary(numpy.less_equal)
    __gt__, __ge__ = _binary(numpy.greater), _binary(numpy.greater_equal)
    __iadd__, __isub__ = _inplace(numpy.add), _inplace(numpy.subtract)
    __imul__, __itruediv__ = _inplace(numpy.multiply), _inplace(numpy.true_divide)
    __hash__ = None

    def __neg__(self):
        return numpy.negative(self)

    def __abs__(self):
        return numpy.absolute(self)

    def __invert__(self):
        return numpy.invert(self)
