"""Per-rank tests of ChunkedReducer (run under mpiexec by test_grad_engine.py)."""

import numpy
import pytest
from mpi4py import MPI

from chainermn_comm.reduce import chunked as _grad
from chainermn_comm.reduce import half as _half
from chainermn_comm.reduce import stream as _stream

from _util import bf16_mean_expected, half_mean_expected

COMM = MPI.COMM_WORLD


def _arrays(seed, dtype, shapes):
    rng = numpy.random.RandomState(seed)
    return [rng.standard_normal(s).astype(dtype) for s in shapes]


SHAPES = [(3,), (17, 5), (1000,), (4, 4, 4), (2500,), (1,), (64, 33)]


def _expected_mean(shapes, dtype, red_dtype):
    size = COMM.Get_size()
    per_rank = [_arrays(r, dtype, shapes) for r in range(size)]
    out = []
    for i in range(len(shapes)):
        if numpy.dtype(red_dtype).itemsize == 2:
            parts = [(per_rank[r][i] * (1.0 / size)).astype(red_dtype) for r in range(size)]
            s = parts[0].astype(numpy.float64)
            for p in parts[1:]:
                s = s + p
            out.append(s)
        else:
            s = per_rank[0][i].astype(numpy.float64)
            for r in range(1, size):
                s = s + per_rank[r][i]
            out.append(s / size)
    return out


@pytest.mark.parametrize('chunk_bytes,direct_bytes', [
    (64, 1 << 30),        # everything packed, many tiny chunks
    (256, 128),           # direct arrays split into many slices, small ones packed
    (1 << 20, 0),         # every array reduced in place
    (4 << 20, 256 << 10),  # defaults
])
@pytest.mark.parametrize('dtype,red', [(numpy.float32, None), (numpy.float64, None),
                                       (numpy.float32, numpy.float16), (numpy.float16, None),
                                       (numpy.float32, numpy.float64)])
def test_mean_matches_reference(chunk_bytes, direct_bytes, dtype, red):
    arrays = _arrays(COMM.Get_rank(), dtype, SHAPES)
    ids = [id(a) for a in arrays]
    r = _grad.ChunkedReducer(COMM, chunk_bytes=chunk_bytes, direct_bytes=direct_bytes)
    r.mean(arrays, dtype=red)
    assert [id(a) for a in arrays] == ids
    red_dtype = numpy.dtype(red or dtype)
    tol = {2: 2e-3, 4: 2e-6, 8: 1e-12}[min(red_dtype.itemsize, numpy.dtype(dtype).itemsize)]
    for got, want in zip(arrays, _expected_mean(SHAPES, dtype, red_dtype)):
        assert got.dtype == numpy.dtype(dtype)
        numpy.testing.assert_allclose(got.astype(numpy.float64), want, rtol=tol, atol=tol)


def test_paths_give_identical_bits():
    results = []
    for chunk_bytes, direct_bytes in [(64, 1 << 30), (256, 0), (4 << 20, 1 << 10)]:
        arrays = _arrays(COMM.Get_rank() + 7, numpy.float32, SHAPES)
        _grad.ChunkedReducer(COMM, chunk_bytes=chunk_bytes, direct_bytes=direct_bytes).mean(arrays)
        results.append(arrays)
    if COMM.Get_size() <= 2:  # two summands: the sum does not depend on MPI's order
        for other in results[1:]:
            for a, b in zip(results[0], other):
                assert numpy.array_equal(a, b)


@pytest.mark.parametrize('red', [None, numpy.float16, 'bfloat16'])
def test_polite_and_paced_waits_give_the_blocking_result(red):
    pacer = _stream.Pacer()
    results = []
    for polite in (False, True, pacer, pacer):  # the second paced call sleeps the learnt pause
        arrays = _arrays(COMM.Get_rank() + 3, numpy.float32, SHAPES)
        r = _grad.ChunkedReducer(COMM, chunk_bytes=256, direct_bytes=128)
        r.polite = polite
        r.mean(arrays, dtype=red)
        results.append(arrays)
    for other in results[1:]:
        for a, b in zip(results[0], other):
            if red is not None or COMM.Get_size() <= 2:  # our float32 adds, or two summands
                assert numpy.array_equal(a, b)
            else:  # MPI's blocking and nonblocking sums may add three ranks in another order
                numpy.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    if COMM.Get_size() == 1 or (red is not None and not _half.one_phase(COMM.Get_size())):
        assert pacer.rate == 0  # a 16-bit wire's two phases keep the shortest pause; one rank sends nothing
    else:
        assert pacer.rate > 0
        assert _stream.POLITE_PAUSE <= pacer.pause() <= _stream.MAX_PAUSE


def test_mean_reuses_buffer_and_ignores_single_rank():
    r = _grad.ChunkedReducer(COMM, chunk_bytes=1024, direct_bytes=512)
    arrays = _arrays(COMM.Get_rank(), numpy.float32, SHAPES)
    r.mean(arrays)
    bufs = {k: list(op._bufs) for k, op in r._ops.items()}
    assert COMM.Get_size() == 1 or any(b is not None for v in bufs.values() for b in v)
    r.mean(arrays)
    assert all(r._ops[k]._bufs[i] is b for k, v in bufs.items() for i, b in enumerate(v) if b is not None)
    if COMM.Get_size() == 1:
        assert all(numpy.array_equal(a, b) for a, b in zip(arrays, _arrays(0, numpy.float32, SHAPES)))


@pytest.mark.parametrize('chunk_bytes,direct_bytes', [(64, 1 << 30), (256, 128), (1 << 20, 0)])
def test_bcast(chunk_bytes, direct_bytes):
    root = COMM.Get_size() - 1
    arrays = _arrays(COMM.Get_rank(), numpy.float32, SHAPES) + _arrays(COMM.Get_rank(), numpy.float64, SHAPES[:3])
    _grad.ChunkedReducer(COMM, chunk_bytes=chunk_bytes, direct_bytes=direct_bytes).bcast(arrays, root=root)
    want = _arrays(root, numpy.float32, SHAPES) + _arrays(root, numpy.float64, SHAPES[:3])
    for a, b in zip(arrays, want):
        assert numpy.array_equal(a, b)


def test_rejects_tiny_chunk():
    with pytest.raises(ValueError, match='chunk_bytes'):
        _grad.ChunkedReducer(COMM, chunk_bytes=8)


@pytest.mark.parametrize('chunk_bytes,direct_bytes', [(64, 1 << 30), (256, 128), (4 << 20, 0)])
@pytest.mark.parametrize('dtype', [numpy.float16, numpy.float32])
def test_half_mean_adds_in_float32_in_rank_order(chunk_bytes, direct_bytes, dtype):
    size = COMM.Get_size()
    arrays = _arrays(COMM.Get_rank() + 3, dtype, SHAPES)
    _grad.ChunkedReducer(COMM, chunk_bytes=chunk_bytes, direct_bytes=direct_bytes).mean(
        arrays, dtype=numpy.float16)
    for i, got in enumerate(arrays):
        if size == 1:
            assert numpy.array_equal(got, _arrays(3, dtype, SHAPES)[i])
            continue
        want = half_mean_expected([_arrays(r + 3, dtype, SHAPES)[i] for r in range(size)])
        assert got.dtype == numpy.dtype(dtype)
        assert numpy.array_equal(got, want), 'array {}: {} differ'.format(
            i, int(numpy.count_nonzero(got != want)))


@pytest.mark.parametrize('magnitude', [1e-7, 1e-3, 1e5])
def test_half_mean_keeps_float16_precision_at_any_magnitude(magnitude):
    # Unscaled, 1e-7 gradients become float16 subnormals (absolute steps of 6e-8) and
    # 1e5 ones overflow to inf once divided by the rank count; the shared power of two
    # keeps both within float16's relative precision of the largest value.
    size = COMM.Get_size()
    per_rank = [[a * numpy.float32(magnitude) for a in _arrays(r + 7, numpy.float32, SHAPES)]
                for r in range(size)]
    arrays = [a.copy() for a in per_rank[COMM.Get_rank()]]
    _grad.ChunkedReducer(COMM, chunk_bytes=4096, direct_bytes=1024).mean(arrays, dtype=numpy.float16)
    for i, got in enumerate(arrays):
        exact = sum(p[i].astype(numpy.float64) for p in per_rank) / size
        top = max(float(numpy.abs(p[i]).max()) for p in per_rank)
        assert numpy.all(numpy.isfinite(got)), i
        numpy.testing.assert_allclose(got, exact, rtol=0, atol=top * 2.0 ** -10)
        if size > 1:
            assert numpy.array_equal(got, half_mean_expected([p[i] for p in per_rank]))


def test_half_mean_lets_non_finite_values_through():
    size, rank = COMM.Get_size(), COMM.Get_rank()
    a = numpy.full(5000, 1e-3 * (rank + 1), dtype=numpy.float32)
    if rank == 0:
        a[5], a[7] = numpy.nan, numpy.inf
    _grad.ChunkedReducer(COMM, chunk_bytes=4096, direct_bytes=1024).mean([a], dtype=numpy.float16)
    assert numpy.isnan(a[5]) and a[7] == numpy.inf
    rest = numpy.delete(a, [5, 7])
    numpy.testing.assert_allclose(rest, 1e-3 * (size + 1) / 2, rtol=2.0 ** -9)
    everyone = COMM.allgather(a)
    assert all(numpy.array_equal(x, a, equal_nan=True) for x in everyone)


@pytest.mark.parametrize('descending', [False, True])
@pytest.mark.parametrize('dtype', [numpy.float16, numpy.float32])
def test_half_mean_of_even_integers_is_exact(dtype, descending):
    # Ranks hold 2, 4, 6 (or 6, 4, 2): float16 adds in some orders give 3.998 for 4.0.
    k = COMM.Get_size() - COMM.Get_rank() if descending else COMM.Get_rank() + 1
    a = numpy.full(1001, 2.0 * k, dtype=dtype)
    b = numpy.full(300000, 2.0 * k, dtype=dtype)
    _grad.ChunkedReducer(COMM, chunk_bytes=4096, direct_bytes=1024).mean([a, b], dtype=numpy.float16)
    assert numpy.all(a == COMM.Get_size() + 1), a[:5]
    assert numpy.all(b == COMM.Get_size() + 1), b[:5]


@pytest.mark.parametrize('chunk_bytes,direct_bytes', [(64, 1 << 30), (256, 128), (4 << 20, 0)])
@pytest.mark.parametrize('dtype', [numpy.float16, numpy.float32, numpy.float64])
def test_bf16_mean_adds_in_float32_in_rank_order(chunk_bytes, direct_bytes, dtype):
    # Each rank's term is rounded to bfloat16, the owner adds them in float32 in rank order,
    # scales by 1/size and rounds once: the same bits whatever the chunks.
    size = COMM.Get_size()
    arrays = _arrays(COMM.Get_rank() + 3, dtype, SHAPES)
    _grad.ChunkedReducer(COMM, chunk_bytes=chunk_bytes, direct_bytes=direct_bytes).mean(
        arrays, dtype='bfloat16')
    for i, got in enumerate(arrays):
        if size == 1:
            assert numpy.array_equal(got, _arrays(3, dtype, SHAPES)[i])
            continue
        per_rank = [_arrays(r + 3, dtype, SHAPES)[i] for r in range(size)]
        want = bf16_mean_expected(per_rank)
        assert got.dtype == numpy.dtype(dtype)
        assert numpy.array_equal(got, want), 'array {}: {} differ'.format(
            i, int(numpy.count_nonzero(got != want)))
        exact = sum(p.astype(numpy.float64) for p in per_rank) / size
        top = max(float(numpy.abs(p).max()) for p in per_rank)
        numpy.testing.assert_allclose(got, exact, rtol=2.0 ** -7, atol=top * 2.0 ** -8)


@pytest.mark.parametrize('magnitude', [1e-30, 1e-7, 1e30])
def test_bf16_mean_keeps_its_precision_at_any_magnitude(magnitude):
    # bfloat16 has float32's range: no prescaling, no overflow, no subnormals in sight.
    size = COMM.Get_size()
    per_rank = [[a * numpy.float32(magnitude) for a in _arrays(r + 7, numpy.float32, SHAPES)]
                for r in range(size)]
    arrays = [a.copy() for a in per_rank[COMM.Get_rank()]]
    _grad.ChunkedReducer(COMM, chunk_bytes=4096, direct_bytes=1024).mean(arrays, dtype='bfloat16')
    for i, got in enumerate(arrays):
        exact = sum(p[i].astype(numpy.float64) for p in per_rank) / size
        top = max(float(numpy.abs(p[i]).max()) for p in per_rank)
        assert numpy.all(numpy.isfinite(got)), i
        numpy.testing.assert_allclose(got, exact, rtol=0, atol=top * 2.0 ** -7)


def test_bf16_mean_lets_non_finite_values_through():
    size, rank = COMM.Get_size(), COMM.Get_rank()
    a = numpy.full(5000, 1e-3 * (rank + 1), dtype=numpy.float32)
    if rank == 0:
        a[5], a[7], a[9] = numpy.nan, numpy.inf, -numpy.inf
        a[11] = numpy.frombuffer(numpy.uint32(0x7FFFFFFF).tobytes(), numpy.float32)[0]  # NaN whose rounding carries
    _grad.ChunkedReducer(COMM, chunk_bytes=4096, direct_bytes=1024).mean([a], dtype='bfloat16')
    assert numpy.isnan(a[5]) and a[7] == numpy.inf and a[9] == -numpy.inf and numpy.isnan(a[11])
    rest = numpy.delete(a, [5, 7, 9, 11])
    numpy.testing.assert_allclose(rest, 1e-3 * (size + 1) / 2, rtol=2.0 ** -7)
    everyone = COMM.allgather(a)
    assert all(numpy.array_equal(x, a, equal_nan=True) for x in everyone)


@pytest.mark.parametrize('descending', [False, True])
def test_bf16_mean_of_even_integers_is_exact(descending):
    k = COMM.Get_size() - COMM.Get_rank() if descending else COMM.Get_rank() + 1
    a = numpy.full(1001, 2.0 * k, dtype=numpy.float32)
    b = numpy.full(300000, 2.0 * k, dtype=numpy.float32)
    _grad.ChunkedReducer(COMM, chunk_bytes=4096, direct_bytes=1024).mean([a, b], dtype='bfloat16')
    assert numpy.all(a == COMM.Get_size() + 1), a[:5]
    assert numpy.all(b == COMM.Get_size() + 1), b[:5]


@pytest.mark.parametrize('red', [None, numpy.float16, 'bfloat16'])
def test_chunk_sizes_give_identical_bits(red):
    # What the tuner may change (the chunk size) never changes the bits where it tunes it.
    results = []
    for chunk_bytes in (1 << 10, 1 << 16, 1 << 20):
        arrays = _arrays(COMM.Get_rank() + 21, numpy.float32, SHAPES + [(70000,)])
        _grad.ChunkedReducer(COMM, chunk_bytes=chunk_bytes).mean(arrays, dtype=red)
        results.append(arrays)
    if red is not None or COMM.Get_size() <= 2:
        for other in results[1:]:
            assert all(numpy.array_equal(a, b) for a, b in zip(results[0], other))
