"""Reduce or broadcast the arrays of many parameters in place, in cache-sized pieces.

Large gradients are all-reduced in place in slices of ``chunk_bytes`` and scaled by
``1/size`` while each slice is still in cache, so they cost no pack and no unpack.
Small gradients (below ``direct_bytes``) are packed into one persistent buffer of
``chunk_bytes``, all-reduced together, and copied back with the averaging fused into
the copy, so that a hundred tiny arrays cost one message rather than a hundred.
"""

import operator
import os

import numpy

from chainermn_comm import _half
from chainermn_comm._guard import number_from_env, stable_code

__all__ = ['ChunkedReducer', 'collect_params', 'params_key', 'params_signature',
           'DEFAULT_CHUNK_BYTES', 'CHUNK_ENV', 'DEFAULT_DIRECT_BYTES', 'DIRECT_ENV']

CHUNK_ENV = 'CHAINERMN_CHUNK_BYTES'
DEFAULT_CHUNK_BYTES = 4 * 1024 * 1024
DIRECT_ENV = 'CHAINERMN_DIRECT_BYTES'
DEFAULT_DIRECT_BYTES = 256 * 1024


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


def params_key(params, attr):
    """Return the shapes and dtype codes of ``param.<attr>`` for every param: the agreement check's key."""
    arrays = [getattr(p, attr) for p in params]
    shapes = tuple(map(_shape_of, arrays))
    dtypes = list(map(_dtype_of, arrays))
    try:
        codes = tuple(map(_dtype_codes.__getitem__, dtypes))
    except KeyError:
        for dt in dtypes:
            if dt not in _dtype_codes:
                _dtype_codes[dt] = stable_code(numpy.dtype(dt).str)
        codes = tuple(map(_dtype_codes.__getitem__, dtypes))
    return shapes, codes


_shape_of = operator.attrgetter('shape')
_dtype_of = operator.attrgetter('dtype')
#: Process-independent codes of the dtypes seen so far (``hash`` of a dtype is not).
_dtype_codes = {}


def params_signature(model, params, attr):
    """Return ``(name, shape, dtype)`` of ``param.<attr>`` for every param, for error messages."""
    names = {id(p): n for n, p in model.namedparams()}
    return tuple((names.get(id(p), '?'), tuple(getattr(p, attr).shape), getattr(p, attr).dtype.str)
                 for p in params)


def _bytes_from_env(name, default):
    return number_from_env(name, default, int, 'an integer number of bytes (e.g. {})'.format(default))


class ChunkedReducer:
    """Reduce or broadcast host arrays in place, in cache-sized pieces.

    Arrays of at least ``direct_bytes`` (and already in the reduction dtype) are
    all-reduced in place, slice by slice, and averaged while the slice is still in
    cache: no pack and no unpack.  Smaller arrays are packed together into one reused
    chunk buffer, so that many tiny gradients cost one message instead of one each.
    """

    def __init__(self, mpi_comm, chunk_bytes=None, direct_bytes=None):
        if chunk_bytes is None:
            chunk_bytes = _bytes_from_env(CHUNK_ENV, DEFAULT_CHUNK_BYTES)
        if chunk_bytes < 64:
            raise ValueError('chunk_bytes must be at least 64 bytes; got {}'.format(chunk_bytes))
        if direct_bytes is None:
            direct_bytes = _bytes_from_env(DIRECT_ENV, DEFAULT_DIRECT_BYTES)
        self.mpi_comm = mpi_comm
        self.chunk_bytes = int(chunk_bytes)
        self.direct_bytes = int(direct_bytes)
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
        Sums are scaled by ``1/size`` after the reduction; with 2-byte dtypes (float16)
        the scaling happens before the cast and the reduction so that sums cannot
        overflow, and float16 terms are added in float32 and rounded once (``_half``).  Either
        way each element gets the same operations whichever path it takes.
        """
        size = self.mpi_comm.Get_size()
        if size == 1:
            return
        comm = self.mpi_comm
        scale = 1.0 / size
        for red_dtype, group in _group_by_dtype(arrays, dtype):
            pre = red_dtype.itemsize == 2
            buf = self._buffer(red_dtype)
            step = buf.size
            small = []
            for a in group:
                if a.dtype != red_dtype or a.nbytes < self.direct_bytes:
                    small.append(a)
                    continue
                for s in range(0, a.size, step):
                    view = a[s:s + step]
                    if pre:
                        _half.scale_into(view, view, scale)
                    _sum_in_place(comm, view)
                    if not pre:
                        numpy.multiply(view, scale, out=view)
            if not small:
                continue

            def reduce_chunk(view):
                _sum_in_place(comm, view)

            if pre:
                pack, unpack = _pack_scaled(scale), _unpack_plain
            else:
                pack, unpack = _pack_plain, _unpack_scaled(scale)
            _pipeline(small, buf, pack, reduce_chunk, unpack)

    def bcast(self, arrays, root=0):
        """Overwrite the C-contiguous host ``arrays`` on every rank with root's values."""
        comm = self.mpi_comm
        is_root = comm.Get_rank() == root
        for red_dtype, group in _group_by_dtype(arrays, None):
            buf = self._buffer(red_dtype)
            step = buf.size
            small = []
            for a in group:
                if a.nbytes < self.direct_bytes:
                    small.append(a)
                    continue
                for s in range(0, a.size, step):
                    comm.Bcast(a[s:s + step], root=root)
            if not small:
                continue

            def bcast_chunk(view):
                comm.Bcast(view, root=root)

            _pipeline(small, buf, _pack_plain if is_root else _pack_none, bcast_chunk,
                      _unpack_none if is_root else _unpack_plain)


def _sum_in_place(comm, view):
    """Sum ``view`` over all ranks in place; float16 is added in float32 and rounded once."""
    from mpi4py import MPI
    if view.dtype == numpy.float16:
        _half.sum_in_place(comm, view)
        return
    comm.Allreduce(MPI.IN_PLACE, view, MPI.SUM)


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
        _half.scale_into(dst, src, scale)
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
