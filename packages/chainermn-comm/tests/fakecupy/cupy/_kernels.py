"""Kernel stand-ins: the chainermn pack/unpack and cast-scale kernels, run as NumPy code."""

import re

import numpy

from cupy._ndarray import ndarray, host_view

__all__ = ['RawKernel', 'ElementwiseKernel']

_CTYPES = {'float16': numpy.float16, 'float': numpy.float32, 'double': numpy.float64,
           'float32': numpy.float32, 'float64': numpy.float64}
_PACK = re.compile(r'chainermn_(pack|unpack)_(float16|float32|float64)_(float16|float32|float64|bfloat16)$')
_CAST = re.compile(r'^y = \((\w+)\)\(\((\w+)\)x \* s\)$')
# The bfloat16 forms (words held as uint16): into the wire, and out of it.
_TO_BF16 = re.compile(r'^y = chainermn_f2bf\(\(float\)\(\((\w+)\)x \* s\)\)$')
_FROM_BF16 = re.compile(r'^y = \((\w+)\)\(chainermn_bf2f\(x\) \* s\)$')


def to_bf16(x):
    """Round float32 values to bfloat16 words (nearest, ties to even; NaN to a quiet NaN), as the kernel does."""
    x = numpy.ascontiguousarray(x, dtype=numpy.float32)
    u = x.view(numpy.uint32).astype(numpy.uint64)
    words = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(numpy.uint16)
    nan = numpy.isnan(x)
    words[nan] = ((u[nan] >> 16) & 0x8000 | 0x7FC0).astype(numpy.uint16)
    return words


def from_bf16(words):
    """Return the float32 values of bfloat16 words."""
    return (numpy.asarray(words, dtype=numpy.uint16).astype(numpy.uint32) << 16).view(numpy.float32)


def _scalar(v):
    return v.item() if isinstance(v, (numpy.generic, numpy.ndarray)) else v


class RawKernel:
    """Run a known chainermn batched copy kernel by name; any other kernel is NotImplementedError."""

    def __init__(self, code, name, options=(), backend='nvrtc', **kwargs):
        if name not in code:
            raise ValueError('fake cupy: kernel {!r} is not defined in its source'.format(name))
        self.code, self.name = code, name
        m = _PACK.match(name)
        self._spec = m.groups() if m else None

    def __call__(self, grid, block, args, shared_mem=0, stream=None):
        if self._spec is None:
            raise NotImplementedError('fake cupy cannot run kernel {!r}'.format(self.name))
        direction, src, buf_name = self._spec
        ptrs, tiles, n_tiles, scale, buf = args
        if not (isinstance(ptrs, ndarray) and isinstance(tiles, ndarray) and isinstance(buf, ndarray)):
            raise TypeError('fake cupy: {} needs device arrays for ptrs, tiles and buf'.format(self.name))
        bf16 = buf_name == 'bfloat16'
        if buf.dtype != numpy.dtype(numpy.uint16 if bf16 else buf_name) or ptrs.dtype != numpy.uint64 \
                or tiles.dtype != numpy.int64:
            raise TypeError('fake cupy: {} got ptrs {}, tiles {}, buf {}'.format(
                self.name, ptrs.dtype, tiles.dtype, buf.dtype))
        if not isinstance(n_tiles, numpy.int64) or not isinstance(scale, numpy.float64):
            raise TypeError('fake cupy: {} needs numpy.int64 n_tiles and numpy.float64 scale'.format(self.name))
        work = numpy.float64 if 'float64' in (src, buf_name) else numpy.float32
        s = work(scale)
        into = to_bf16 if bf16 else (lambda v: v.astype(buf_name))
        out_of = from_bf16 if bf16 else (lambda v: v)
        b = buf._a
        rows = tiles._a.reshape(-1, 4)[:int(n_tiles)]
        table = ptrs._a
        itemsize = numpy.dtype(src).itemsize
        for a, st, ln, o in rows.tolist():
            arr = host_view(int(table[a]) + st * itemsize, ln * itemsize, src)
            if direction == 'pack':
                b[o:o + ln] = into((arr.astype(work) * s).astype(numpy.float32) if bf16 else arr.astype(work) * s)
            else:
                arr[...] = (out_of(b[o:o + ln]).astype(work) * s).astype(src)


class ElementwiseKernel:
    """Run the chainermn cast-and-scale kernel ``y = (D)((W)x * s)``; others are NotImplementedError."""

    def __init__(self, in_params, out_params, operation, name='kernel', **kwargs):
        self.name = name
        op = operation.strip().rstrip(';')
        m = _CAST.match(op)
        self._spec = (_CTYPES[m.group(1)], _CTYPES[m.group(2)]) if m else None
        self._bf16 = None
        m = _TO_BF16.match(op)
        if m:
            self._spec, self._bf16 = (numpy.uint16, _CTYPES[m.group(1)]), 'to'
        m = _FROM_BF16.match(op)
        if m:
            self._spec, self._bf16 = (_CTYPES[m.group(1)], numpy.float32), 'from'
        self._in = [p.split() for p in in_params.split(',')]
        self._out = [p.split() for p in out_params.split(',')]

    def __call__(self, x, s, y):
        if self._spec is None:
            raise NotImplementedError('fake cupy cannot run kernel {!r}'.format(self.name))
        for (t, _), v in zip(self._in + self._out, (x, s, y)):
            if isinstance(v, numpy.ndarray):
                raise TypeError('fake cupy: {} got a host array'.format(self.name))
            if numpy.dtype(getattr(v, 'dtype', type(v))) != numpy.dtype(t):
                raise TypeError('fake cupy: {} expects {} but got {}'.format(
                    self.name, t, getattr(v, 'dtype', type(v))))
        if x.shape != y.shape:
            raise ValueError('fake cupy: {} shapes differ: {} vs {}'.format(self.name, x.shape, y.shape))
        out_t, work = self._spec
        if self._bf16 == 'to':
            y._a[...] = to_bf16((x._a.astype(work) * work(s)).astype(numpy.float32))
        elif self._bf16 == 'from':
            y._a[...] = (from_bf16(x._a) * work(s)).astype(out_t)
        else:
            y._a[...] = (x._a.astype(work) * work(s)).astype(out_t)
        return y
