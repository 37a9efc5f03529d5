"""Reduce or broadcast the arrays of many parameters through one reused, cache-sized buffer.

Gradients are copied chunk by chunk into a persistent buffer of ``chunk_bytes``,
all-reduced in place, and copied back with the averaging fused into the copy.  The
buffer stays in cache, so memory traffic is one read and one write of each gradient,
the same as an in-place all-reduce of an already packed buffer.
"""

import os

import numpy

__all__ = ['ChunkedReducer', 'collect_params', 'DEFAULT_CHUNK_BYTES', 'CHUNK_ENV']

CHUNK_ENV = 'CHAINERMN_CHUNK_BYTES'
DEFAULT_CHUNK_BYTES = 4 * 1024 * 1024


def collect_params(model, zero_fill):
    """Return the parameters of ``model`` that take part, in a rank-independent order.

    Parameters whose data is not initialised are skipped.  Parameters without a
    gradient are skipped unless ``zero_fill``, in which case a zero gradient is
    allocated for them so that every rank reduces the same arrays.
    """
    params = []
    for _, param in sorted(model.namedparams(), key=lambda kv: kv[0]):
        if param.array is None:
            continue
        if param.grad is None:
            if not zero_fill:
                continue
            xp = param.device.xp if hasattr(param, 'device') else numpy
            param.grad = xp.zeros_like(param.array)
        params.append(param)
    return params


class ChunkedReducer:
    """Pack, communicate and unpack host arrays through one reused chunk buffer."""

    def __init__(self, mpi_comm, chunk_bytes=None):
        if chunk_bytes is None:
            chunk_bytes = int(os.environ.get(CHUNK_ENV, DEFAULT_CHUNK_BYTES))
        if chunk_bytes < 64:
            raise ValueError('chunk_bytes must be at least 64 bytes; got {}'.format(chunk_bytes))
        self.mpi_comm = mpi_comm
        self.chunk_bytes = int(chunk_bytes)
        self._buffers = {}

    def _buffer(self, dtype):
        buf = self._buffers.get(dtype)
        if buf is None:
            buf = numpy.empty(max(1, self.chunk_bytes // dtype.itemsize), dtype=dtype)
            self._buffers[dtype] = buf
        return buf

    def mean(self, arrays, dtype=None):
        """Average the C-contiguous host ``arrays`` over all ranks, in place.

        ``dtype`` is the dtype the reduction runs in (the arrays' own when None).
        With float16 the scaling happens before the reduction so that sums cannot overflow.
        """
        from mpi4py import MPI
        size = self.mpi_comm.Get_size()
        if size == 1:
            return
        scale = 1.0 / size
        for red_dtype, group in _group_by_dtype(arrays, dtype):
            pre = red_dtype.itemsize == 2
            buf = self._buffer(red_dtype)
            comm = self.mpi_comm

            def reduce_chunk(view):
                comm.Allreduce(MPI.IN_PLACE, view, MPI.SUM)

            if pre:
                pack = _pack_scaled(scale)
                unpack = _unpack_plain
            else:
                pack = _pack_plain
                unpack = _unpack_scaled(scale)
            _pipeline(group, buf, pack, reduce_chunk, unpack)

    def bcast(self, arrays, root=0):
        """Overwrite the C-contiguous host ``arrays`` on every rank with root's values."""
        comm = self.mpi_comm
        is_root = comm.Get_rank() == root
        for red_dtype, group in _group_by_dtype(arrays, None):
            buf = self._buffer(red_dtype)

            def bcast_chunk(view):
                comm.Bcast(view, root=root)

            _pipeline(group, buf, _pack_plain if is_root else _pack_none, bcast_chunk,
                      _unpack_none if is_root else _unpack_plain)


def _group_by_dtype(arrays, dtype):
    groups = {}
    for a in arrays:
        key = numpy.dtype(dtype) if dtype is not None else a.dtype
        groups.setdefault(key, []).append(a.reshape(-1))
    return sorted(groups.items(), key=lambda kv: kv[0].str)


def _pack_plain(dst, src):
    numpy.copyto(dst, src, casting='unsafe')


def _pack_none(dst, src):
    pass


def _pack_scaled(scale):
    def pack(dst, src):
        numpy.multiply(src, scale, out=dst, casting='unsafe')
    return pack


def _unpack_plain(dst, src):
    numpy.copyto(dst, src, casting='unsafe')


def _unpack_none(dst, src):
    pass


def _unpack_scaled(scale):
    def unpack(dst, src):
        numpy.multiply(src, scale, out=dst, casting='unsafe')
    return unpack


def _pipeline(flat_arrays, buf, pack, communicate, unpack):
    """Stream ``flat_arrays`` through ``buf``: pack a chunk, communicate it, unpack it."""
    cap = buf.size
    fill = 0
    pending = []  # (array, start, buf_offset, length)
    for arr in flat_arrays:
        n = arr.size
        start = 0
        while start < n:
            take = min(cap - fill, n - start)
            pack(buf[fill:fill + take], arr[start:start + take])
            pending.append((arr, start, fill, take))
            fill += take
            start += take
            if fill == cap:
                _flush(buf, fill, pending, communicate, unpack)
                fill = 0
                pending = []
    if fill:
        _flush(buf, fill, pending, communicate, unpack)


def _flush(buf, fill, pending, communicate, unpack):
    communicate(buf[:fill])
    for arr, start, off, take in pending:
        unpack(arr[start:start + take], buf[off:off + take])
