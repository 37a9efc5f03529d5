"""Reduce or broadcast the arrays of many parameters in place, in cache-sized pieces.

Large gradients are all-reduced in place in slices of ``chunk_bytes`` and scaled by
``1/size`` while each slice is still in cache, so they cost no pack and no unpack.
Small gradients (below ``direct_bytes``) are packed into reused buffers of
``chunk_bytes``, all-reduced together, and copied back with the averaging fused into
the copy, so that a hundred tiny arrays cost one message rather than a hundred.  The
pieces are pipelined (``reduce.stream``): copies of one overlap the transfer of the others.
"""

import operator

import numpy

from chainermn_comm.reduce import codecs as _codecs
from chainermn_comm.reduce import half as _half
from chainermn_comm.reduce import stream as _stream
from chainermn_comm import settings
from chainermn_comm.guard import stable_code
from chainermn_comm.protocol import CHUNK_BYTES_ENV, DIRECT_BYTES_ENV

__all__ = ['ChunkedReducer', 'reduction_key', 'DTYPE_CODES', 'REDUCTION_KEYS', 'collect_params', 'params_key', 'params_signature',
           'DEFAULT_CHUNK_BYTES', 'CHUNK_CHOICES', 'LOSSY_CHUNK_CHOICES', 'CHUNK_ENV',
           'DEFAULT_DIRECT_BYTES', 'DIRECT_ENV', 'zero_grad']

CHUNK_ENV = CHUNK_BYTES_ENV
DEFAULT_CHUNK_BYTES = 4 * 1024 * 1024
#: The chunk sizes the tuner may choose from (``reduce.tune``) when the size is not pinned.
CHUNK_CHOICES = (1024 * 1024, 4 * 1024 * 1024, 16 * 1024 * 1024)
#: The same for a 16-bit wire: its pipeline keeps float32 and wire buffers per slot, and a 16 MiB
#: chunk's first call paid 0.3-0.5 s for them on the namespace cluster and never won afterwards.
LOSSY_CHUNK_CHOICES = (1024 * 1024, 4 * 1024 * 1024)
DIRECT_ENV = DIRECT_BYTES_ENV
DEFAULT_DIRECT_BYTES = 256 * 1024


def collect_params(model, zero_fill):
    """Return the parameters of ``model`` that take part, in a rank-independent order.

    Parameters whose data is not initialised are skipped.  Parameters without a
    gradient are skipped unless ``zero_fill``, in which case a zero gradient is
    allocated for them so that every rank reduces the same arrays.  A parameter that
    the model reaches under several names (a link registered in several places) is
    taken once, under its first name: averaging it twice would divide its sum twice.
    """
    params = []
    seen = set()
    for _, param in sorted(model.namedparams(), key=lambda kv: kv[0]):
        if param.array is None or id(param) in seen:
            continue
        seen.add(id(param))
        if param.grad is None:
            if not zero_fill:
                continue
            zero_grad(param)
        params.append(param)
    return params


def zero_grad(param):
    """Give ``param`` a zero gradient on its own device (``zero_fill``: every rank reduces the same arrays)."""
    xp = param.device.xp if hasattr(param, 'device') else numpy
    param.grad = xp.zeros_like(param.array)


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
#: The same table, for callers that build :func:`params_key`'s answer themselves (a miss: call it).
DTYPE_CODES = _dtype_codes


def params_signature(model, params, attr):
    """Return ``(name, shape, dtype)`` of ``param.<attr>`` for every param, for error messages."""
    names = {id(p): n for n, p in model.namedparams()}
    return tuple((names.get(id(p), '?'), tuple(getattr(p, attr).shape), getattr(p, attr).dtype.str)
                 for p in params)


class ChunkedReducer:
    """Reduce or broadcast host arrays in pieces that stream through a few reused buffers.

    Arrays of at least ``direct_bytes`` (and already in the reduction dtype) are all-reduced
    in place, slice by slice, and averaged while the slice is still in cache: no pack and no
    unpack.  Smaller arrays are packed together into reused chunk buffers, so that many tiny
    gradients cost one message instead of one each.  Pieces are pipelined (``reduce.stream``):
    packing, casting and unpacking of one piece overlap the transfer of the others.
    """

    #: Pieces alive at once: enough for the two-phase float16 schedule.
    SLOTS = 4

    def __init__(self, mpi_comm, chunk_bytes=None, direct_bytes=None):
        #: Whether the chunk size was given (argument or ``CHAINERMN_CHUNK_BYTES``): not tuned.
        self.chunk_pinned = chunk_bytes is not None or settings.read(CHUNK_ENV) is not None
        if chunk_bytes is None:
            chunk_bytes = settings.read(CHUNK_ENV, DEFAULT_CHUNK_BYTES)
        if chunk_bytes < 64:
            raise ValueError('chunk_bytes must be at least 64 bytes; got {}'.format(chunk_bytes))
        if direct_bytes is None:
            direct_bytes = settings.read(DIRECT_ENV, DEFAULT_DIRECT_BYTES)
        self.mpi_comm = mpi_comm
        self.chunk_bytes = int(chunk_bytes)
        self.direct_bytes = int(direct_bytes)
        #: Wait for transfers sleeping between tests instead of spinning (see ``reduce.stream.run``):
        #: False, True (the shortest pause) or a ``reduce.stream.Pacer`` (a pause fitted to the link).
        self.polite = False
        self._ops = {}
        self._lanes = {}  # (dtype, chunk elements) -> the buffer of the one-piece average

    def _op(self, kind, dtype, arg):
        key = (kind, dtype.str, arg, self.chunk_bytes)
        op = self._ops.get(key)
        if op is None:
            chunk = max(1, self.chunk_bytes // dtype.itemsize)
            comm = self.mpi_comm
            if kind == 'half':
                op = _stream.HalfSumOp(comm, chunk, self.SLOTS, dtype)
            elif kind == 'sum':
                op = _stream.SumOp(comm, dtype, chunk, self.SLOTS, arg)
            else:
                op = _stream.BcastOp(comm, dtype, chunk, self.SLOTS, arg)
            self._ops[key] = op
        return op

    def release_unused(self):
        """Drop the buffers of chunk sizes other than the current one (the tuner tried them)."""
        for key in [k for k in self._ops if k[3] != self.chunk_bytes]:
            del self._ops[key]
        self._lanes = {k: v for k, v in self._lanes.items()
                       if k[1] == max(1, self.chunk_bytes // numpy.dtype(k[0]).itemsize)}

    def mean(self, arrays, dtype=None):
        """Average the C-contiguous host ``arrays`` over all ranks, in place.

        ``dtype`` is the dtype the reduction runs in (the arrays' own when None), or
        ``'bfloat16'``.  Sums are scaled by ``1/size`` after the reduction.  The 2-byte wires
        (``reduce.codecs``) add their terms in float32 and round once (``reduce.half``); float16 terms are
        scaled before the cast, together with a power of two per array that the ranks agree on
        (``reduce.half.shared_factors``), so that sums cannot overflow and small values stay normal;
        bfloat16 has float32's range and multiplies the float32 sum by ``1/size`` instead.
        Either way each element gets the same operations whichever path it takes.
        """
        size = self.mpi_comm.Get_size()
        if size == 1:
            return
        scale = 1.0 / size
        if arrays and not self.polite and self._mean_one_piece(arrays, dtype, scale):
            return
        for red_dtype, group in _group_by_dtype(arrays, dtype):
            if isinstance(red_dtype, _codecs.Codec):
                op = self._op('half', red_dtype, None)
                if red_dtype.prescale:
                    op.use_factors(group, *_half.shared_factors(
                        self.mpi_comm, group, scale, _stream.polite_wait if self.polite else None))
                else:
                    ones = [1.0] * len(group)
                    op.use_factors(group, ones, ones, post=scale)
                pieces = _stream.cut(group, op.chunk, _never)
            else:
                op = self._op('sum', red_dtype, scale)
                direct = self.direct_bytes

                def in_place(a, d=red_dtype):
                    return a.dtype == d and a.nbytes >= direct
                pieces = _stream.cut(group, op.chunk, in_place)
            _stream.run(pieces, op, self.SLOTS, self.polite)

    def _mean_one_piece(self, arrays, dtype, scale):
        """Average ``arrays`` when they make one packed piece of ``mean``; return whether they did.

        One dtype, summed exactly in it, every array below ``direct_bytes`` and all of them in one
        chunk: the schedule of ``reduce.stream`` would pack them into one buffer, ``Iallreduce``
        it and copy back scaled.  This does the same operations (the same bits) without the
        schedule's machinery: a small model's steady-state update stays short.
        """
        d = arrays[0].dtype
        key = _keys.get(d if dtype is None else dtype)
        if not isinstance(key, numpy.dtype) or key != d:
            return False
        direct, total = self.direct_bytes, 0
        for a in arrays:
            if a.dtype != d or a.nbytes >= direct:
                return False
            total += a.size
        chunk = max(1, self.chunk_bytes // d.itemsize)
        if total == 0 or total > chunk:
            return False
        buf = self._lanes.get((d.str, chunk))
        if buf is None:
            buf = self._lanes[(d.str, chunk)] = numpy.empty(chunk, dtype=d)
        data, off = buf[:total], 0
        for a in arrays:
            numpy.copyto(data[off:off + a.size], a.reshape(-1), casting='unsafe')
            off += a.size
        from mpi4py import MPI
        self.mpi_comm.Iallreduce(MPI.IN_PLACE, data, MPI.SUM).Wait()
        off = 0
        for a in arrays:
            numpy.multiply(data[off:off + a.size], scale, out=a.reshape(-1), casting='unsafe')
            off += a.size
        return True

    def bcast(self, arrays, root=0):
        """Overwrite the C-contiguous host ``arrays`` on every rank with root's values."""
        if self.mpi_comm.Get_size() == 1:
            return
        direct = self.direct_bytes
        for red_dtype, group in _group_by_dtype(arrays, None, wires=False):
            op = self._op('bcast', red_dtype, root)
            pieces = _stream.cut(group, op.chunk, lambda a: a.nbytes >= direct)
            _stream.run(pieces, op, self.SLOTS, self.polite)


def _never(a):
    return False


def reduction_key(dtype, array_dtype):
    """Return what the sums of an array of ``array_dtype`` run in: a wire format (``reduce.codecs``) or a dtype."""
    want = array_dtype if dtype is None else dtype
    try:
        return _keys[want]
    except (KeyError, TypeError):  # TypeError: unhashable
        key = _codecs.codec_of(want) or numpy.dtype(want)
    if len(_keys) < 64:
        try:
            _keys[want] = key
        except TypeError:
            pass
    return key


#: reduction_key's answers so far (it runs once per array and call: 3 us uncached).
_keys = {}
#: The same table, for callers that look an answer up themselves (a miss: call reduction_key).
REDUCTION_KEYS = _keys


def _group_by_dtype(arrays, dtype, wires=True):
    groups = {}
    for a in arrays:
        key = reduction_key(dtype, a.dtype) if wires else a.dtype
        groups.setdefault(key, []).append(a.reshape(-1))
    return sorted(groups.items(), key=lambda kv: kv[0].str)
