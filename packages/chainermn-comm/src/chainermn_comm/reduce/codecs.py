"""The 2-byte wire formats of gradient averages: float16 and bfloat16, added in float32 on every path.

A wire format says how a float32 (or float64) term becomes 16 bits on the wire and back, and
how the owner of a segment adds the ranks' terms in float32:

- ``FLOAT16``: NumPy's float16 cast.  Terms are scaled first (``1/size`` times a power of two
  the ranks agree on, ``reduce.half.shared_factors``), because float16's range is narrow.
- ``BFLOAT16``: float32's sign and exponent with an 8-bit mantissa: the upper 16 bits of the
  float32, rounded to nearest even (integer work at memory speed, no prescaling: the range is
  float32's).  Carried as ``uint16`` words, so neither NumPy nor MPI needs to know the type;
  ``bfloat16 -> float32`` is a shift left by 16.  NaN stays NaN (``0x7FC0`` with its sign, as
  ml_dtypes, JAX and TensorFlow round it); infinities and overflow round as IEEE does.  The
  ``1/size`` of the average multiplies the float32 sum, once, before it is rounded for the way
  back, so each term costs one rounding and the unpack is a plain shift.  Where the optional
  ml_dtypes package is installed, its casts (the same bits, NaN included) do the rounding and the
  widening: 2.7x and 3x faster than NumPy's integer passes.

Work is done in blocks of ``BLOCK`` elements through per-thread scratch buffers, so that a
conversion's passes stay in cache.
"""

import threading

import numpy

__all__ = ['Codec', 'FLOAT16', 'BFLOAT16', 'codec_of', 'is_bfloat16', 'bf16_encode', 'bf16_decode',
           'BLOCK', 'BFLOAT16_NAME', 'load_ml_dtypes']

#: Elements converted per pass (128 KiB of float32: a few of them stay in L2).
BLOCK = 1 << 15
BFLOAT16_NAME = 'bfloat16'
_F32 = numpy.dtype(numpy.float32)
_U16 = numpy.dtype(numpy.uint16)
_U32 = numpy.dtype(numpy.uint32)
_local = threading.local()


def _scratch(name, dtype, n):
    """Return a per-thread buffer of ``n`` elements of ``dtype`` (grown as needed)."""
    buf = getattr(_local, name, None)
    if buf is None or buf.size < n:
        buf = numpy.empty(max(n, BLOCK), dtype=dtype)
        setattr(_local, name, buf)
    return buf[:n]


def is_bfloat16(dtype):
    """Return True for ``'bfloat16'`` and for ml_dtypes' ``bfloat16`` (without importing ml_dtypes)."""
    if isinstance(dtype, str):
        return dtype.strip().lower() == BFLOAT16_NAME
    name = getattr(dtype, 'name', None) or getattr(dtype, '__name__', None)
    if name != BFLOAT16_NAME:
        return False
    try:
        return numpy.dtype(dtype).itemsize == 2
    except TypeError:
        return False


_ml = []  # [ml_dtypes.bfloat16's dtype, or None]: looked up once


def _ml_bfloat16():
    """Return ml_dtypes' bfloat16 dtype when ml_dtypes is installed (optional), else None."""
    if not _ml:
        try:
            import ml_dtypes
            _ml.append(numpy.dtype(ml_dtypes.bfloat16))
        except Exception:  # not installed, or built for another NumPy
            _ml.append(None)
    return _ml[0]


def load_ml_dtypes():
    """Import ml_dtypes now if it is installed (its casts serve the bfloat16 wire); return whether it is."""
    return _ml_bfloat16() is not None


def bf16_encode(dst, src):
    """Round float32 ``src`` to bfloat16 (nearest, ties to even) into uint16 ``dst``.

    With ml_dtypes installed its cast does it (the same bits, NaN included, in one pass);
    otherwise five integer passes per cache-sized block.
    """
    ml = _ml_bfloat16()
    if ml is not None:
        with numpy.errstate(invalid='ignore'):  # NaN -> quiet NaN is what we want
            numpy.copyto(dst.view(ml), src, casting='unsafe')
        return
    n = src.size
    u = src.view(_U32)
    t = _scratch('enc', _U32, min(n, BLOCK))
    for s in range(0, n, BLOCK):
        uu = u[s:s + BLOCK]
        tt = t[:uu.size]
        numpy.right_shift(uu, 16, out=tt)
        numpy.bitwise_and(tt, 1, out=tt)   # the kept mantissa's last bit: ties go to even
        numpy.add(tt, 0x7FFF, out=tt)
        numpy.add(tt, uu, out=tt)
        numpy.right_shift(tt, 16, out=dst[s:s + BLOCK], casting='unsafe')
        if numpy.isnan(numpy.maximum.reduce(src[s:s + BLOCK])):  # NaN propagates through max
            block = src[s:s + BLOCK]
            nan = numpy.isnan(block)
            dst[s:s + BLOCK][nan] = (uu[nan] >> 16) & 0x8000 | 0x7FC0


def bf16_decode(dst, src):
    """Widen uint16 bfloat16 words ``src`` into float32 ``dst`` (exact: a shift by 16).

    With ml_dtypes installed its cast does it (the same bits, NaN payloads included, about three
    times faster than NumPy's widening shift).
    """
    ml = _ml_bfloat16()
    if ml is not None:
        numpy.copyto(dst, src.view(ml), casting='unsafe')
        return
    wide = dst.view(_U32)
    numpy.copyto(wide, src, casting='unsafe')  # a plain widening copy, then an in-place shift:
    numpy.left_shift(wide, 16, out=wide)         # faster than one shift that casts as it goes


class Codec:
    """A 2-byte wire format (see the module doc); ``storage`` is the dtype of its buffers."""

    __slots__ = ('name', 'storage', 'str', 'prescale')

    def __init__(self, name, storage, key, prescale):
        self.name = name
        self.storage = numpy.dtype(storage)
        self.str = key          # sort key, like numpy.dtype.str
        self.prescale = prescale  # terms scaled by 1/size and a power of two before the cast

    itemsize = 2

    def __repr__(self):
        return '<wire {}>'.format(self.name)

    def encode(self, dst, src, scale=1.0):
        """Write ``src * scale`` (computed in float32, float64 if ``src`` is) into wire ``dst``."""
        if self is FLOAT16:
            wide = numpy.float64 if src.dtype == numpy.float64 else numpy.float32
            numpy.multiply(src, scale, out=dst, dtype=wide, casting='unsafe')
            return
        if src.dtype == _F32 and scale == 1.0:
            bf16_encode(dst, src)
            return
        tmp = _scratch('wide', _F32, min(src.size, BLOCK))
        wide = numpy.float64 if src.dtype == numpy.float64 else numpy.float32
        for s in range(0, src.size, BLOCK):
            part = tmp[:min(BLOCK, src.size - s)]
            numpy.multiply(src[s:s + BLOCK], scale, out=part, dtype=wide, casting='unsafe')
            bf16_encode(dst[s:s + BLOCK], part)

    def decode(self, dst, src, scale=1.0):
        """Write wire ``src`` times ``scale`` into ``dst`` (any float dtype)."""
        if self is FLOAT16:
            wide = numpy.float64 if dst.dtype == numpy.float64 else numpy.float32
            numpy.multiply(src, scale, out=dst, dtype=wide, casting='unsafe')
            return
        if dst.dtype == _F32:
            bf16_decode(dst, src)
            if scale != 1.0:
                numpy.multiply(dst, scale, out=dst)
            return
        tmp = _scratch('wide', _F32, min(src.size, BLOCK))
        wide = numpy.float64 if dst.dtype == numpy.float64 else numpy.float32
        for s in range(0, src.size, BLOCK):
            part = tmp[:min(BLOCK, src.size - s)]
            bf16_decode(part, src[s:s + BLOCK])
            numpy.multiply(part, scale, out=dst[s:s + BLOCK], dtype=wide, casting='unsafe')

    def sum_terms(self, out, terms):
        """Add wire ``terms`` into float32 ``out`` in the order given (at least two terms)."""
        if self is FLOAT16:
            numpy.add(terms[0], terms[1], out=out, dtype=numpy.float32)
            for t in terms[2:]:
                numpy.add(out, t, out=out, dtype=numpy.float32)
            return
        ml = _ml_bfloat16()
        if ml is not None:  # ml_dtypes widens as the add reads: 1.2x decoding each term first
            numpy.add(terms[0].view(ml), terms[1].view(ml), out=out, dtype=_F32)
            for t in terms[2:]:
                numpy.add(out, t.view(ml), out=out, dtype=_F32)
            return
        tmp = _scratch('sum', _F32, min(out.size, BLOCK))
        for s in range(0, out.size, BLOCK):
            o = out[s:s + BLOCK]
            part = tmp[:o.size]
            bf16_decode(o, terms[0][s:s + BLOCK])
            for t in terms[1:]:
                bf16_decode(part, t[s:s + BLOCK])
                numpy.add(o, part, out=o)


FLOAT16 = Codec('float16', numpy.float16, numpy.dtype(numpy.float16).str, True)
BFLOAT16 = Codec(BFLOAT16_NAME, numpy.uint16, 'bf16', False)


def codec_of(dtype):
    """Return the wire format of ``dtype`` (float16 or bfloat16), or None for other dtypes."""
    if isinstance(dtype, Codec):
        return dtype
    if dtype is None:
        return None
    if is_bfloat16(dtype):
        return BFLOAT16
    if numpy.dtype(dtype) == numpy.float16:
        return FLOAT16
    return None
