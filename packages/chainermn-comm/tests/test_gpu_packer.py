"""Single-process GPU tests of the gradient packer and the NCCL wrapper (marked gpu)."""

import numpy
import pytest

from chainermn_comm import _gpu_support

pytestmark = pytest.mark.gpu


@pytest.fixture
def cupy():
    cp = pytest.importorskip('cupy')
    if not _gpu_support.gpu_available():
        pytest.skip(_gpu_support.cupy_status()[1])
    return cp


def _arrays(cp, dtype, n=37):
    rng = numpy.random.RandomState(1)
    sizes = [int(s) for s in rng.randint(0, 20000, size=n)]
    return [cp.asarray(rng.standard_normal(s).astype(dtype)) for s in sizes]


@pytest.mark.parametrize('batched', [False, True])
@pytest.mark.parametrize('src', ['float16', 'float32', 'float64'])
@pytest.mark.parametrize('buf', ['float16', 'float32', 'float64'])
def test_pack_unpack_roundtrip(cupy, batched, src, buf):
    from chainermn_comm.gpu._kernels import GradPacker
    arrays = _arrays(cupy, src)
    originals = [a.get() for a in arrays]
    p = GradPacker(batched=batched, tile=1000)
    plan = p.plan(arrays, buf, align=4)
    b = p.buffer(buf, plan.layout.padded)
    p.pack(arrays, b, plan, scale=0.25)
    if batched:
        assert p.last_launches <= 2  # one kernel (+ one fill of the padding)
    else:
        assert p.last_launches >= sum(1 for a in arrays if a.size)
    host = b.get().astype(numpy.float64)
    tol = 1e-3 if 'float16' in (src, buf) else 1e-6
    for a, o, off in zip(arrays, originals, plan.layout.offsets):
        numpy.testing.assert_allclose(host[off:off + a.size], o.astype(numpy.float64) * 0.25,
                                      rtol=tol, atol=tol)
    assert (host[plan.layout.total:] == 0).all()
    for a in arrays:
        a.fill(0)
    p.unpack(b, arrays, plan, scale=4.0)
    for a, o in zip(arrays, originals):
        numpy.testing.assert_allclose(a.get().astype(numpy.float64), o, rtol=tol * 4, atol=tol * 4)


def test_strided_arrays_use_per_array_path(cupy):
    from chainermn_comm.gpu._kernels import GradPacker
    base = cupy.arange(40, dtype=numpy.float32).reshape(5, 8)
    arrays = [base[:, ::2], cupy.ones(7, numpy.float32)]
    p = GradPacker(batched=True)
    plan = p.plan(arrays, numpy.float32)
    b = p.buffer(numpy.float32, plan.layout.padded)
    p.pack(arrays, b, plan)
    assert b.get().tolist() == base[:, ::2].get().ravel().tolist() + [1.0] * 7


def test_pointer_table_follows_reallocated_arrays(cupy):
    from chainermn_comm.gpu._kernels import GradPacker
    p = GradPacker(batched=True)
    a = [cupy.ones(5, numpy.float32)]
    plan = p.plan(a, numpy.float32)
    b = p.buffer(numpy.float32, plan.layout.padded)
    p.pack(a, b, plan)
    a2 = [cupy.full(5, 3.0, numpy.float32)]
    assert p.plan(a2, numpy.float32) is plan
    p.pack(a2, b, plan)
    assert b.get().tolist() == [3.0] * 5


def test_wait_stream_times_out_naming_the_operation(cupy):
    from chainermn_comm.gpu._nccl import wait_stream
    spin = cupy.RawKernel(r'''
extern "C" __global__ void spin(long long cycles) {
    long long t0 = clock64();
    while (clock64() - t0 < cycles) { }
}''', 'spin')
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        spin((1,), (1,), (numpy.int64(4_000_000_000),))  # about 2 s
    with pytest.raises(TimeoutError, match='spin test'):
        wait_stream(stream, 0.2, lambda: None, 'spin test')
    stream.synchronize()
    wait_stream(stream, 1.0, lambda: None, 'empty')  # finished work returns at once


def test_nccl_wait_raises_on_async_error(cupy):
    from chainermn_comm.gpu._nccl import wait_stream

    def boom():
        raise RuntimeError('async NCCL error')

    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        x = cupy.ones(50_000_000, numpy.float32)
        for _ in range(20):
            x = x * 1.0001
    try:
        wait_stream(stream, 5.0, boom, 'busy')
    except RuntimeError as e:
        assert 'async NCCL error' in str(e)
    stream.synchronize()
