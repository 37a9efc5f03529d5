"""Per-rank tests of NodeReducer, the node-shared-memory average (run by test_shm_reduce.py)."""

import os

import numpy
import pytest
from mpi4py import MPI

from chainermn_comm.reduce import chunked as _grad
from chainermn_comm.reduce import node_shared as _shm_reduce
from chainermn_comm import _topology

from _util import bf16_mean_expected, half_mean_expected

COMM = MPI.COMM_WORLD
SHAPES = [(3,), (17, 5), (0,), (1000,), (4, 4, 4), (), (2500,), (1,), (64, 33)]
EXPECT_SHM = os.environ.get('EXPECT_SHM') == '1'


def _arrays(seed, dtype, shapes=SHAPES):
    rng = numpy.random.RandomState(seed)
    return [rng.standard_normal(s).astype(dtype) for s in shapes]


def _reducer(chunk_bytes):
    topo = _topology.detect_topology(COMM)
    return _shm_reduce.NodeReducer(COMM, topo, _grad.ChunkedReducer(COMM), chunk_bytes=chunk_bytes)


def _expected(seeds, dtype, red_dtype, shapes=SHAPES):
    """Mean over ranks in float64 of the values each rank contributes (after its casts)."""
    size = COMM.Get_size()
    per_rank = [_arrays(s, dtype, shapes) for s in seeds]
    out = []
    for i in range(len(shapes)):
        if red_dtype.itemsize == 2:
            parts = [(p[i] * (1.0 / size)).astype(red_dtype).astype(numpy.float64) for p in per_rank]
            out.append(sum(parts))
        else:
            out.append(sum(p[i].astype(red_dtype).astype(numpy.float64) for p in per_rank) / size)
    return out


def _assert_same_on_every_rank(arrays):
    for other in COMM.allgather(arrays):
        for a, b in zip(arrays, other):
            assert a.dtype == b.dtype and a.shape == b.shape
            assert numpy.array_equal(a, b), 'ranks disagree on the averaged gradient'


@pytest.mark.parametrize('chunk_bytes', [64, 200, 4096, 1 << 20])
@pytest.mark.parametrize('dtype,red', [(numpy.float32, None), (numpy.float64, None),
                                       (numpy.float16, None), (numpy.float32, numpy.float16),
                                       (numpy.float32, numpy.float64)])
def test_mean_matches_reference(chunk_bytes, dtype, red):
    r = _reducer(chunk_bytes)
    arrays = _arrays(COMM.Get_rank(), dtype)
    ids = [id(a) for a in arrays]
    r.mean(arrays, dtype=red)
    if COMM.Get_size() > 1:
        assert r.uses_shared_memory is EXPECT_SHM
    assert [id(a) for a in arrays] == ids
    red_dtype = numpy.dtype(red or dtype)
    tol = {2: 3e-3, 4: 3e-6, 8: 1e-12}[min(red_dtype.itemsize, numpy.dtype(dtype).itemsize)]
    for got, want in zip(arrays, _expected(range(COMM.Get_size()), dtype, red_dtype)):
        assert got.dtype == numpy.dtype(dtype) and got.shape == want.shape
        numpy.testing.assert_allclose(got.astype(numpy.float64), want, rtol=tol, atol=tol)
    _assert_same_on_every_rank(arrays)
    r.free()


def test_repeated_calls_mixed_dtypes_and_layouts():
    """Reuse one window across calls whose dtypes, layouts and chunk counts change."""
    r = _reducer(256)
    for it in range(6):
        shapes = SHAPES if it % 2 == 0 else [(129,), (7, 3), (40,)]
        seed = COMM.Get_rank() * 10 + it
        a32 = _arrays(seed, numpy.float32, shapes)
        a64 = _arrays(seed + 1000, numpy.float64, shapes)
        mixed = [x for pair in zip(a32, a64) for x in pair]
        r.mean(mixed)
        seeds = [q * 10 + it for q in range(COMM.Get_size())]
        for got, want in zip(a32, _expected(seeds, numpy.float32, numpy.dtype(numpy.float32), shapes)):
            numpy.testing.assert_allclose(got, want, rtol=3e-6, atol=3e-6)
        want64 = _expected([s + 1000 for s in seeds], numpy.float64, numpy.dtype(numpy.float64), shapes)
        for got, want in zip(a64, want64):
            numpy.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
        _assert_same_on_every_rank(mixed)
    r.free()


def test_two_summands_match_mpi_bitwise():
    """With two ranks each sum has one order, so shared memory and MPI give the same bits."""
    if COMM.Get_size() != 2:
        pytest.skip('needs exactly two ranks')
    a = _arrays(COMM.Get_rank() + 3, numpy.float32)
    b = [x.copy() for x in a]
    _reducer(128).mean(a)
    _grad.ChunkedReducer(COMM, chunk_bytes=128, direct_bytes=64).mean(b)
    for x, y in zip(a, b):
        assert numpy.array_equal(x, y)


def test_large_arrays_cross_many_chunks():
    shapes = [(300000,), (5,), (123457,)]
    arrays = _arrays(COMM.Get_rank(), numpy.float32, shapes)
    _reducer(1 << 16).mean(arrays)
    want = _expected(range(COMM.Get_size()), numpy.float32, numpy.dtype(numpy.float32), shapes)
    for got, w in zip(arrays, want):
        numpy.testing.assert_allclose(got, w, rtol=3e-6, atol=3e-6)
    _assert_same_on_every_rank(arrays)


def test_switch_off_with_environment(monkeypatch):
    monkeypatch.setenv(_shm_reduce.SHM_ENV, '0')
    r = _reducer(1024)
    arrays = _arrays(COMM.Get_rank(), numpy.float32)
    r.mean(arrays)
    if COMM.Get_size() > 1:
        assert r.uses_shared_memory is False
    want = _expected(range(COMM.Get_size()), numpy.float32, numpy.dtype(numpy.float32))
    for got, w in zip(arrays, want):
        numpy.testing.assert_allclose(got, w, rtol=3e-6, atol=3e-6)


def test_rejects_tiny_chunk():
    with pytest.raises(ValueError, match=_shm_reduce.SHM_CHUNK_ENV):
        _reducer(8)


@pytest.mark.parametrize('chunk_bytes', [64, 4096])
@pytest.mark.parametrize('dtype', [numpy.float32, numpy.float16])
def test_mean_into_out_leaves_inputs_alone(chunk_bytes, dtype):
    src = _arrays(COMM.Get_rank() + 5, dtype)
    keep = [a.copy() for a in src]
    flat = numpy.full(sum(a.size for a in src), numpy.nan, dtype=dtype)
    out, o = [], 0
    for a in src:
        out.append(flat[o:o + a.size])
        o += a.size
    r = _reducer(chunk_bytes)
    r.mean(src, out=out)
    for a, k in zip(src, keep):
        assert numpy.array_equal(a, k)
    in_place = [a.copy() for a in src]
    r.mean(in_place)
    for got, want in zip(out, in_place):
        assert numpy.array_equal(got, want.reshape(-1))
    with pytest.raises(ValueError, match='same size'):
        r.mean(src, out=out[:-1])


@pytest.mark.parametrize('chunk_bytes', [64, 4096, 1 << 20])
@pytest.mark.parametrize('dtype', [numpy.float16, numpy.float32])
def test_half_mean_adds_in_float32(chunk_bytes, dtype):
    """A node sums in float32; only the nodes' sums cross in float16, added in float32 and rounded once."""
    size = COMM.Get_size()
    if size == 1:
        pytest.skip('one rank: nothing is averaged')
    arrays = _arrays(COMM.Get_rank() + 11, dtype)
    _reducer(chunk_bytes).mean(arrays, dtype=numpy.float16)
    nodes = _nodes()
    for i, got in enumerate(arrays):
        want = half_mean_expected([_arrays(q + 11, dtype)[i] for q in range(size)], nodes)
        assert numpy.array_equal(got, want), 'array {}: {} of {} differ'.format(
            i, int(numpy.count_nonzero(got != want)), got.size)


def _nodes():
    """Return the ranks of each node the reducer uses (None: every rank alone, MPI messages only)."""
    size = COMM.Get_size()
    if not EXPECT_SHM:
        return None
    per = int(os.environ.get('CHAINERMN_RANKS_PER_NODE') or size)
    return [list(range(s, min(s + per, size))) for s in range(0, size, per)]


@pytest.mark.parametrize('magnitude', [1e-7, 1e-3, 1e5])
def test_half_mean_keeps_float16_precision_at_any_magnitude(magnitude):
    # The nodes' float32 sums cross as float16 scaled by a shared power of two: 1e-7 sums
    # stay normal numbers and 1e5 ones cannot overflow.
    size = COMM.Get_size()
    per_rank = [[numpy.array(a * numpy.float32(magnitude)) for a in _arrays(q + 7, numpy.float32)]
                for q in range(size)]
    arrays = [a.copy() for a in per_rank[COMM.Get_rank()]]
    _reducer(4096).mean(arrays, dtype=numpy.float16)
    for i, got in enumerate(arrays):
        if not got.size:
            continue
        exact = sum(p[i].astype(numpy.float64) for p in per_rank) / size
        top = max(float(numpy.abs(p[i]).max()) for p in per_rank)
        assert numpy.all(numpy.isfinite(got)), i
        numpy.testing.assert_allclose(got, exact, rtol=0, atol=top * 2.0 ** -10)
        if size > 1:
            assert numpy.array_equal(got, half_mean_expected([p[i] for p in per_rank], _nodes()))
    _assert_same_on_every_rank(arrays)


@pytest.mark.parametrize('descending', [False, True])
@pytest.mark.parametrize('param_dtype,grad_dtype', [(numpy.float16, None),
                                                    (numpy.float32, numpy.float16),
                                                    (numpy.float32, 'bfloat16')])
def test_half_gradient_mean_of_even_integers_is_exact(param_dtype, grad_dtype, descending):
    # Ranks hold 2, 4, 6 (or 6, 4, 2): adding 2.0 + 1.333 first in float16 gave 3.998 for 4.0.
    import chainer
    import chainermn_comm
    comm = chainermn_comm.create_communicator('naive', mpi_comm=COMM, allreduce_grad_dtype=grad_dtype)
    model = chainer.links.Linear(30, 40)
    for p in model.params():
        p.array = p.array.astype(param_dtype)
        k = COMM.Get_size() - COMM.Get_rank() if descending else COMM.Get_rank() + 1
        p.grad = numpy.full(p.array.shape, 2.0 * k, dtype=param_dtype)
    comm.multi_node_mean_grad(model)
    for name, p in model.namedparams():
        assert p.grad.dtype == numpy.dtype(param_dtype), name
        assert numpy.all(p.grad == COMM.Get_size() + 1), (name, p.grad.ravel()[:4])


@pytest.mark.parametrize('chunk_bytes', [64, 4096, 1 << 20])
@pytest.mark.parametrize('dtype', [numpy.float16, numpy.float32])
def test_bf16_mean_adds_in_float32(chunk_bytes, dtype):
    """A node sums in float32; only the nodes' sums cross in bfloat16, added in float32 and rounded once."""
    size = COMM.Get_size()
    if size == 1:
        pytest.skip('one rank: nothing is averaged')
    arrays = _arrays(COMM.Get_rank() + 13, dtype)
    _reducer(chunk_bytes).mean(arrays, dtype='bfloat16')
    nodes = _nodes()
    for i, got in enumerate(arrays):
        want = bf16_mean_expected([_arrays(q + 13, dtype)[i] for q in range(size)], nodes)
        assert numpy.array_equal(got, want), 'array {}: {} of {} differ'.format(
            i, int(numpy.count_nonzero(got != want)), got.size)
    _assert_same_on_every_rank(arrays)


@pytest.mark.parametrize('red', [None, numpy.float16, 'bfloat16'])
def test_knobs_the_tuner_turns_give_identical_bits(red):
    """Shared-memory chunk sizes never change the bits; shared memory on or off does not with two
    ranks and an exact wire (the only case the tuner switches it)."""
    r = _reducer(None)
    results = []
    for shared, chunk in [(True, None), (True, 512 * 1024), (True, 2048 * 1024), (True, 1024 * 1024),
                          (False, None)]:
        r.configure(shared=shared, chunk_bytes=chunk)
        arrays = _arrays(COMM.Get_rank() + 17, numpy.float32, SHAPES + [(400000,)])
        r.mean(arrays, dtype=red)
        results.append(arrays)
    same = results[:4] if red is not None or COMM.Get_size() != 2 else results
    for other in same[1:]:
        assert all(numpy.array_equal(a, b) for a, b in zip(same[0], other))
    with pytest.raises(ValueError, match='outside'):
        r.configure(chunk_bytes=64 << 20)
    r.free()
