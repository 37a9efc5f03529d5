"""The 16-bit wire formats (``reduce.codecs``): bfloat16 rounding and widening, float16 as before."""

import threading

import numpy
import pytest

from chainermn_comm.reduce import codecs as _codecs
from chainermn_comm.reduce import dtypes as _dtypes


@pytest.fixture(params=['numpy', 'ml_dtypes'], autouse=True)
def rounding(request, monkeypatch):
    """Run every test with NumPy's integer rounding and, where installed, with ml_dtypes' cast."""
    if request.param == 'numpy':
        monkeypatch.setattr(_codecs, '_ml', [None])
    else:
        ml_dtypes = pytest.importorskip('ml_dtypes')
        monkeypatch.setattr(_codecs, '_ml', [numpy.dtype(ml_dtypes.bfloat16)])
    return request.param


def _bits(values):
    return numpy.array(values, dtype=numpy.uint32).view(numpy.float32)


def _reference(x):
    """Round float32 to bfloat16 words with Python integers: nearest, ties to even."""
    out = []
    for u in x.view(numpy.uint32).tolist():
        if (u & 0x7FFFFFFF) > 0x7F800000:
            out.append((u >> 16) & 0x8000 | 0x7FC0)
            continue
        out.append(((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF)
    return numpy.array(out, dtype=numpy.uint16)


SPECIAL = _bits([0x3F808000,   # 1 + 2**-8: a tie, rounds down to even 1.0
                 0x3F818000,   # a tie whose kept bit is odd: rounds up
                 0x3F808001,   # just above a tie: up
                 0x7F7FFFFF,   # the largest float32: rounds to +inf, as IEEE does
                 0xFF7FFFFF,   # and its negative to -inf
                 0x7F800000, 0xFF800000,   # infinities stay
                 0x7FC00000, 0xFFC00000,   # quiet NaNs
                 0x7F800001,   # a NaN whose payload is below the kept bits (would round to inf)
                 0x7FFFFFFF,   # a NaN whose rounding carries into the sign (would become -0.0)
                 0x00000001,   # the smallest subnormal: rounds to +0
                 0x80400000,   # a negative subnormal kept exactly
                 0x00000000, 0x80000000])


def test_bf16_rounds_to_nearest_even_and_keeps_nan():
    words = numpy.empty(SPECIAL.size, numpy.uint16)
    _codecs.bf16_encode(words, SPECIAL)
    assert words.tolist() == _reference(SPECIAL).tolist()
    assert words[:4].tolist() == [0x3F80, 0x3F82, 0x3F81, 0x7F80]
    back = numpy.empty(SPECIAL.size, numpy.float32)
    _codecs.bf16_decode(back, words)
    assert numpy.isnan(back[7:11]).all() and back[3] == numpy.inf and back[4] == -numpy.inf
    assert back[11] == 0.0 and back[12] == SPECIAL[12]


def test_bf16_widening_of_every_word_is_the_shift_by_16():
    words = numpy.arange(1 << 16, dtype=numpy.uint32).astype(numpy.uint16)
    wide = numpy.empty(words.size, numpy.float32)
    _codecs.bf16_decode(wide, words)  # NaN payloads and signs included, in both modes
    assert numpy.array_equal(wide.view(numpy.uint32), words.astype(numpy.uint32) << 16)


@pytest.mark.parametrize('n', [1, _codecs.BLOCK - 1, _codecs.BLOCK + 3, 3 * _codecs.BLOCK])
def test_bf16_matches_the_reference_across_blocks(n):
    rng = numpy.random.RandomState(n)
    x = rng.standard_normal(n).astype(numpy.float32) * numpy.float32(10.0) ** rng.randint(-30, 30, n)
    x = x.astype(numpy.float32)
    x[::97] = numpy.nan
    words = numpy.empty(n, numpy.uint16)
    _codecs.bf16_encode(words, x)
    assert numpy.array_equal(words, _reference(x))
    wide = numpy.empty(n, numpy.float32)
    _codecs.bf16_decode(wide, words)
    finite = numpy.isfinite(x)
    # 8 significant bits: the relative error of a normal value is at most 2**-8.
    normal = finite & (numpy.abs(x) > 1e-37)
    assert numpy.all(numpy.abs(wide[normal] - x[normal]) <= numpy.abs(x[normal]) * 2.0 ** -8)
    assert numpy.isnan(wide[~finite & numpy.isnan(x)]).all()


@pytest.mark.parametrize('src_dtype', [numpy.float16, numpy.float32, numpy.float64])
@pytest.mark.parametrize('scale', [1.0, 0.25, 1.0 / 3])
def test_codec_encode_decode_with_scales(src_dtype, scale):
    x = numpy.linspace(-3, 3, 70001).astype(src_dtype)
    for codec in (_codecs.FLOAT16, _codecs.BFLOAT16):
        wire = numpy.empty(x.size, codec.storage)
        codec.encode(wire, x, scale)
        if codec is _codecs.BFLOAT16:
            want = _reference(numpy.multiply(x, scale, dtype=numpy.float64 if src_dtype == numpy.float64
                                             else numpy.float32).astype(numpy.float32))
            assert numpy.array_equal(wire, want)
        out = numpy.empty(x.size, src_dtype)
        codec.decode(out, wire, 1.0 / scale)
        tol = 2.0 ** -8 if codec is _codecs.BFLOAT16 else 2.0 ** -10
        numpy.testing.assert_allclose(out.astype(numpy.float64), x.astype(numpy.float64),
                                      rtol=2 * tol, atol=1e-3)


def test_sum_terms_adds_in_float32_in_order():
    terms16 = [numpy.full(5, v, numpy.float16) for v in (2.0, 4.0 / 3, 2.0 / 3)]
    out = numpy.empty(5, numpy.float32)
    _codecs.FLOAT16.sum_terms(out, terms16)
    assert numpy.all(out == (numpy.float32(2.0) + numpy.float32(numpy.float16(4 / 3)))
                     + numpy.float32(numpy.float16(2 / 3)))
    rng = numpy.random.RandomState(0)
    xs = [rng.standard_normal(_codecs.BLOCK + 5).astype(numpy.float32) for _ in range(3)]
    words = [_reference(x) for x in xs]
    wide = [(w.astype(numpy.uint32) << 16).view(numpy.float32) for w in words]
    out = numpy.empty(xs[0].size, numpy.float32)
    _codecs.BFLOAT16.sum_terms(out, words)
    assert numpy.array_equal(out, (wide[0] + wide[1]) + wide[2])


def test_threads_use_their_own_scratch():
    xs = [numpy.random.RandomState(i).standard_normal(5 * _codecs.BLOCK).astype(numpy.float64)
          for i in range(4)]
    outs = [numpy.empty(x.size, numpy.uint16) for x in xs]

    def work(i):
        for _ in range(5):
            _codecs.BFLOAT16.encode(outs[i], xs[i], 0.5)
    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for x, o in zip(xs, outs):
        assert numpy.array_equal(o, _reference((x * 0.5).astype(numpy.float32)))


def test_grad_dtype_names():
    assert _dtypes.validate_grad_dtype('bfloat16') == 'bfloat16'
    assert _dtypes.validate_grad_dtype(' BFloat16 ') == 'bfloat16'
    assert _dtypes.validate_grad_dtype('auto') == 'auto'
    assert _dtypes.validate_grad_dtype(None) is None
    assert _dtypes.validate_grad_dtype(numpy.float16) == numpy.dtype(numpy.float16)
    assert _codecs.codec_of('bfloat16') is _codecs.BFLOAT16
    assert _codecs.codec_of(numpy.float16) is _codecs.FLOAT16
    assert _codecs.codec_of(numpy.float32) is None and _codecs.codec_of(None) is None
    for bad in ('bf16', 'float8', numpy.int16, 'automatic'):
        with pytest.raises(ValueError, match="'bfloat16'"):
            _dtypes.validate_grad_dtype(bad)


def test_ml_dtypes_bfloat16_is_accepted_when_installed():
    ml_dtypes = pytest.importorskip('ml_dtypes')
    assert _dtypes.validate_grad_dtype(ml_dtypes.bfloat16) == 'bfloat16'
    assert _dtypes.validate_grad_dtype(numpy.dtype(ml_dtypes.bfloat16)) == 'bfloat16'
    x = numpy.random.RandomState(1).standard_normal(1000).astype(numpy.float32)
    x[3] = numpy.nan
    words = numpy.empty(x.size, numpy.uint16)
    _codecs.bf16_encode(words, x)
    theirs = x.astype(ml_dtypes.bfloat16).view(numpy.uint16)
    assert numpy.array_equal(words, theirs)  # the same rounding as JAX and TensorFlow, NaN included
