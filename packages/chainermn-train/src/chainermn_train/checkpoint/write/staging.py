"""A consistent host copy of what a snapshot holds, in buffers reused from one save to the next.

A background save must not write arrays that training goes on changing, so at the save every
array the object serializes is copied, on the calling thread, into a host buffer kept for its key
(made again only when its shape or dtype changes).  Arrays on a GPU (CuPy, imported only when one
is met) are copied into page-locked (pinned) host buffers, which the device copies to fastest.
Everything else (Python numbers, strings, ``None``) becomes a new array, as Chainer's serializer
makes it.  The next save may reuse the buffers only once the write that reads them has finished:
the checkpointer waits for it first.
"""

import chainer
import numpy

__all__ = ['Staging', 'capture']


class _Capture(chainer.serializer.Serializer):
    """Record each value a ``serialize`` method hands over, under Chainer's npz key, uncopied."""

    def __init__(self, target, path=''):
        self.target = target
        self.path = path

    def __getitem__(self, key):
        return _Capture(self.target, self.path + key.strip('/') + '/')

    def __call__(self, key, value):
        self.target[self.path + key.lstrip('/')] = value
        return value


def capture(obj):
    """Return ``{key: value}`` of what ``obj`` serializes (a dict is taken as it is), not copied."""
    if isinstance(obj, dict):
        return dict(obj)
    target = {}
    _Capture(target).save(obj)
    return target


def _is_cupy(value):
    return type(value).__module__.split('.')[0] == 'cupy'


class Staging:
    """Host buffers, one per key, that :meth:`copy` fills with a snapshot's arrays."""

    def __init__(self):
        self._buffers = {}
        self._pinned = {}   # key -> the pinned memory block its buffer views (kept alive)

    @property
    def nbytes(self):
        """Return the bytes the staging buffers hold."""
        return sum(b.nbytes for b in self._buffers.values())

    def _buffer(self, key, shape, dtype, pinned):
        buf = self._buffers.get(key)
        if (buf is not None and buf.shape == shape and buf.dtype == dtype
                and (key in self._pinned) == pinned):
            return buf
        if pinned:
            import cupy   # only a GPU array leads here
            count = int(numpy.prod(shape, dtype=numpy.int64))
            mem = cupy.cuda.alloc_pinned_memory(max(count * dtype.itemsize, 1))
            buf = numpy.frombuffer(mem, dtype, count).reshape(shape)
            self._pinned[key] = mem
        else:
            buf = numpy.empty(shape, dtype)
            self._pinned.pop(key, None)
        self._buffers[key] = buf
        return buf

    def copy(self, values):
        """Return ``{key: array}``: every array of ``values`` copied into this staging's buffers."""
        out = {}
        for key, value in values.items():
            if isinstance(value, numpy.ndarray) and not value.dtype.hasobject:
                buf = self._buffer(key, value.shape, value.dtype, False)
                numpy.copyto(buf, value)
                out[key] = buf
            elif _is_cupy(value):
                buf = self._buffer(key, tuple(value.shape), numpy.dtype(value.dtype), True)
                value.get(out=buf)   # synchronous: the copy is whole when this returns
                out[key] = buf
            elif value is None:
                out[key] = None
            elif isinstance(value, chainer.get_array_types()):   # chainerx, another device
                out[key] = numpy.array(chainer.backend.CpuDevice().send(value), copy=True)
            else:
                out[key] = numpy.array(value)   # numbers, strings: a new array already
        for key in set(self._buffers) - set(out):   # keys gone since the last save
            del self._buffers[key]
            self._pinned.pop(key, None)
        return out
