"""Unit tests of the hooks' arithmetic and API that need no MPI: shapes, orthogonalisation, resolve."""

import numpy
import pytest

from chainermn_comm import hooks
from chainermn_comm.hooks import lowrank


def test_matrix_shape_and_compressed_rank():
    assert lowrank.matrix_shape((64, 3, 3, 3)) == (64, 27)
    assert lowrank.compressed_rank((5,), 4, 2.0) == 0            # vectors: exact
    assert lowrank.compressed_rank((), 4, 2.0) == 0
    assert lowrank.compressed_rank((512, 4608), 4, 2.0) == 4     # factors 200x smaller
    assert lowrank.compressed_rank((10, 12), 4, 2.0) == 0        # 120 < 2 * 22 * 4
    assert lowrank.compressed_rank((3, 100), 8, 0.5) == 3        # capped by the matrix rank


def test_orthogonalize_batch_equals_one_by_one_and_is_orthonormal():
    rng = numpy.random.RandomState(0)
    p = rng.standard_normal((5, 40, 4)).astype(numpy.float32)
    p[2, :, 3] = p[2, :, 0] * 2  # a dependent column becomes (near) zero, never NaN
    one = [lowrank.orthogonalize(numpy, m.copy()) for m in p]
    batch = lowrank.orthogonalize(numpy, p.copy())
    for a, b in zip(one, batch):
        assert a.tobytes() == b.tobytes()
    for k, m in enumerate(batch):
        g = m.astype(numpy.float64).T @ m
        cols = 3 if k == 2 else 4
        numpy.testing.assert_allclose(g[:cols, :cols], numpy.eye(cols), atol=1e-5)
    assert numpy.isfinite(batch).all()
    z = lowrank.orthogonalize(numpy, numpy.zeros((6, 2), numpy.float32))
    assert not z.any()


def test_initial_q_is_the_same_for_a_name_and_seed():
    a = lowrank.initial_q(numpy, '/l1/W', 7, 3, 0, numpy.float32)
    b = lowrank.initial_q(numpy, '/l1/W', 7, 3, 0, numpy.float32)
    c = lowrank.initial_q(numpy, '/l2/W', 7, 3, 0, numpy.float32)
    assert a.shape == (7, 3) and a.dtype == numpy.float32
    assert a.tobytes() == b.tobytes() and a.tobytes() != c.tobytes()


def test_resolve_and_names():
    assert hooks.resolve(None) is None
    assert str(hooks.resolve(numpy.float16)) == 'float16' and hooks.resolve(numpy.float16).is_wire
    assert str(hooks.resolve('bfloat16')) == 'bfloat16'
    assert str(hooks.resolve('auto')) == 'auto'
    assert hooks.resolve(numpy.float64).wire == numpy.dtype(numpy.float64)
    psgd = hooks.PowerSGD(rank=2)
    assert hooks.resolve(psgd) is psgd and str(psgd) == 'powersgd-r2' and not psgd.is_wire

    def my_hook(comm, bucket):
        pass

    fn = hooks.resolve(my_hook)
    assert isinstance(fn, hooks.FunctionHook) and str(fn) == 'my_hook' and not fn.is_wire
    auto = hooks.Auto(powersgd=hooks.PowerSGD(rank=3))
    assert str(auto) == 'auto+powersgd-r3' and not auto.is_wire
    with pytest.raises(TypeError, match='PowerSGD'):
        hooks.Auto(powersgd='yes')


def test_grad_bucket():
    b = hooks.GradBucket([numpy.zeros(3), numpy.zeros((2, 2))], ['/a', '/b'], index=1, count=3)
    assert not b.first and not b.last and b.nbytes == 56
    assert hooks.GradBucket([], [], 0, 1).first and hooks.GradBucket([], [], 0, 1).last
    with pytest.raises(ValueError, match='2 gradients but 1 names'):
        hooks.GradBucket([numpy.zeros(1), numpy.zeros(1)], ['/a'])


def test_mean_needs_a_chainermn_communicator():
    with pytest.raises(TypeError, match='chainermn communicator'):
        hooks.mean(object(), [numpy.zeros(2)])


def test_base_hook_must_be_implemented():
    with pytest.raises(NotImplementedError, match='__call__'):
        hooks.CommHook()(None, hooks.GradBucket([], []))


def _check_host_products(products, n, m, r, dtype, seed):
    """Check ``products`` (``lowrank_host`` or compiled) against float64 products; return what they gave."""
    rng = numpy.random.RandomState(seed)
    g = rng.standard_normal((n, m)).astype(dtype)
    e = rng.standard_normal((n, m)).astype(dtype)
    qt = rng.standard_normal((r, m)).astype(dtype)
    mat, pt = e.copy(), numpy.empty((r, n), dtype)
    products.project(mat, qt, pt, add=g)
    assert mat.tobytes() == (e + g).tobytes()  # M = E + G, rounded once
    numpy.testing.assert_allclose(pt, qt.astype(numpy.float64) @ mat.T, rtol=1e-4, atol=1e-3)
    pt_plain, g_before = numpy.empty_like(pt), g.copy()
    products.project(g, qt, pt_plain)  # no error memory: the gradient alone, left as it was
    assert g.tobytes() == g_before.tobytes()
    numpy.testing.assert_allclose(pt_plain, qt.astype(numpy.float64) @ g.T, rtol=1e-4, atol=1e-3)
    q2 = numpy.empty_like(qt)
    products.back_project(mat, pt, q2)
    numpy.testing.assert_allclose(q2, pt.astype(numpy.float64) @ mat, rtol=1e-4, atol=1e-2)
    out, err = numpy.empty_like(g), mat.copy()
    products.reconstruct(pt, q2, out, err)
    want_out = pt.T.astype(numpy.float64) @ q2
    numpy.testing.assert_allclose(out, want_out, rtol=1e-4, atol=1e-2)
    numpy.testing.assert_allclose(err, mat - want_out, rtol=1e-4, atol=1e-2)
    again = numpy.empty_like(g)
    products.reconstruct(pt, q2, again)  # no error memory: the same bits
    assert again.tobytes() == out.tobytes()
    return mat, pt, q2, out, err


@pytest.mark.parametrize('dtype', [numpy.float32, numpy.float64])
@pytest.mark.parametrize('n,m,r', [(77, 1000, 4), (9, 13, 1), (10, 7, 2), (11, 30, 5), (8, 40, 8)])
def test_compiled_host_products_equal_the_plain_products(dtype, n, m, r):
    pytest.importorskip('numba')
    from chainermn_comm.hooks import lowrank_jit
    k = lowrank_jit.kernels(dtype)
    assert k is not None, 'Numba is installed but the products did not compile'
    mat, pt, q2, out, err = _check_host_products(k, n, m, r, dtype, seed=n * m + r)
    # Fixed order, no fused multiply-add: exactly NumPy's elementwise sum of the columns' products,
    # so ranks on any CPU write the same bits.
    want = None
    for c in range(0, r - r % 4, 4):
        group = pt[c, :, None] * q2[c] + pt[c + 1, :, None] * q2[c + 1]
        group = group + pt[c + 2, :, None] * q2[c + 2]
        group = group + pt[c + 3, :, None] * q2[c + 3]
        want = group if want is None else want + group
    for c in range(r - r % 4, r):
        want = pt[c, :, None] * q2[c] if want is None else want + pt[c, :, None] * q2[c]
    assert out.tobytes() == want.tobytes()
    assert err.tobytes() == (mat - want).tobytes()


def test_compiled_host_products_refuse_other_dtypes():
    from chainermn_comm.hooks import lowrank_jit
    assert lowrank_jit.kernels(numpy.float16) is None
    assert lowrank_jit.why_not(numpy.float16) == 'no compiled products for float16'


def test_without_numba_or_with_a_broken_one_there_are_no_compiled_products(monkeypatch):
    from chainermn_comm.hooks import lowrank_jit
    monkeypatch.setattr(lowrank_jit, '_compiled', {})
    monkeypatch.setattr(lowrank_jit, '_why', {})
    monkeypatch.setattr(lowrank_jit, '_jit', [None])  # what _build gives when Numba cannot import
    assert lowrank_jit.kernels(numpy.float32) is None
    assert lowrank_jit.why_not(numpy.float32).startswith('Numba is not installed')

    def broken(*args):
        raise RuntimeError('LLVM says no\nmore lines')
    monkeypatch.setattr(lowrank_jit, '_compiled', {})
    monkeypatch.setattr(lowrank_jit, '_jit', [(broken, broken, broken)])
    assert lowrank_jit.kernels(numpy.float32) is None
    assert lowrank_jit.why_not(numpy.float32) == 'Numba failed: RuntimeError: LLVM says no'


def test_host_products_by_blocks_equal_the_plain_products():
    from chainermn_comm.hooks import lowrank_host
    n, m, r = 77, 1000, 3  # 65 rows per 256 KiB block: two blocks, the last one ragged
    assert lowrank_host.block_rows(numpy.zeros((n, m), numpy.float32)) < n
    _check_host_products(lowrank_host, n, m, r, numpy.float32, seed=1)
