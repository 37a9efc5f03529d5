"""Per-rank GPU communicator tests (run under mpiexec by test_gpu_mpi.py).

$CHAINERMN_TEST_GPU_COMMS lists the communicators to test (comma-separated).
"""

import os

import numpy
import pytest

cupy = pytest.importorskip('cupy')

from chainermn_comm import create_communicator  # NOQA: E402

NAMES = [n for n in os.environ.get('CHAINERMN_TEST_GPU_COMMS', 'flat').split(',') if n]
_comms = {}


def get(name, **kw):
    key = (name, tuple(sorted(kw.items())))
    if key not in _comms:
        from mpi4py import MPI
        topo_rank = MPI.COMM_WORLD.Get_rank()
        cupy.cuda.Device(0 if cupy.cuda.runtime.getDeviceCount() == 1 else topo_rank).use()
        _comms[key] = create_communicator(name, **kw)
    return _comms[key]


class _Dev:
    xp = cupy


class _Param:
    def __init__(self, array, grad):
        self.array = array
        self.grad = grad
        self.device = _Dev()


class _Model:
    def __init__(self, params):
        self._p = params

    def namedparams(self):
        return list(self._p.items())


def _model(rank, dtype=numpy.float32, shapes=((3, 4), (17,), (2, 3, 5), (0,), (1000,))):
    params = {}
    for i, s in enumerate(shapes):
        n = int(numpy.prod(s))
        base = cupy.arange(n, dtype=numpy.float64).reshape(s)
        params['p{:02d}'.format(i)] = _Param((base + 100 * rank).astype(dtype),
                                             (base * (rank + 1) + i).astype(dtype))
    return _Model(params)


@pytest.mark.parametrize('name', NAMES)
def test_topology_and_type(name):
    c = get(name)
    assert c.name == name
    assert 0 <= c.intra_rank < c.intra_size and 0 <= c.inter_rank < c.inter_size
    assert c.intra_size * c.inter_size >= c.size


@pytest.mark.parametrize('name', NAMES)
@pytest.mark.parametrize('batched', [False, True])
@pytest.mark.parametrize('grad_dtype', [None, numpy.float16, numpy.float32, numpy.float64, 'bfloat16', 'auto'])
def test_allreduce_grad_values(name, batched, grad_dtype):
    c = get(name, batched_copy=batched, allreduce_grad_dtype=grad_dtype)
    size = c.size
    # 'auto' tunes over the first calls (float32, float16, bfloat16): every one averages.
    for call in range(12 if grad_dtype == 'auto' else 1):
        m = _model(c.rank)
        c.allreduce_grad(m)
        for i, (k, p) in enumerate(sorted(m.namedparams())):
            base = numpy.arange(p.grad.size, dtype=numpy.float64).reshape(p.grad.shape)
            want = base * (size + 1) / 2.0 + i
            assert isinstance(p.grad, cupy.ndarray) and p.grad.dtype == numpy.float32
            # bfloat16 keeps 8 significant bits: each term and the sum round by 2**-9 at most.
            tol = {'bfloat16': 2.0 ** -7, 'auto': 2.0 ** -7}.get(grad_dtype, 2e-3 if grad_dtype == numpy.float16
                                                                else 1e-6)
            numpy.testing.assert_allclose(p.grad.get(), want, rtol=tol, atol=tol * 10, err_msg=k)
    if grad_dtype == 'auto' and size > 1:
        if name == 'naive':  # host staging: the host path's tuner (wire and knobs)
            assert c._tuned.tuning.tuner.calls == 12
        else:  # the device wire alone: a warm-up, then 3 wires in one to three rounds
            tuner = c._device_wire_tuning.tuner
            assert tuner.calls == 12 and tuner.history and 4 <= tuner.history[0][0] <= 10
            assert sorted(tuner.history[0][1]['dtype']) == ['bfloat16', 'float16', 'float32']


@pytest.mark.parametrize('name', NAMES)
def test_fp16_does_not_overflow_or_lose_small_grads(name):
    c = get(name, allreduce_grad_dtype=numpy.float16, batched_copy=True)
    big = cupy.full((64,), 60000.0, numpy.float32)       # sum over ranks could overflow fp16
    small = cupy.full((64,), 1e-4, numpy.float32)
    m = _Model({'a': _Param(cupy.zeros(64, numpy.float32), big),
                'b': _Param(cupy.zeros(64, numpy.float32), small)})
    c.allreduce_grad(m)
    numpy.testing.assert_allclose(m._p['a'].grad.get(), 60000.0, rtol=1e-3)
    # 1e-4 / size may be a float16 subnormal (spacing 2**-24): each rank's term rounds by at most
    # half of that, and the sum stays exact below 2**-14, so the mean is off by at most size * 2**-25.
    numpy.testing.assert_allclose(m._p['b'].grad.get(), 1e-4, rtol=1e-3, atol=c.size * 2.0 ** -25)


@pytest.mark.parametrize('name', NAMES)
def test_zero_fill_and_multi_node_mean_grad(name):
    c = get(name)
    m = _model(c.rank)
    m._p['p01'].grad = None
    c.multi_node_mean_grad(m, zero_fill=True)
    g = m._p['p01'].grad
    assert isinstance(g, cupy.ndarray) and g.shape == (17,)
    assert float(abs(g).max().get()) == 0.0


@pytest.mark.parametrize('name', NAMES)
@pytest.mark.parametrize('batched', [False, True])
def test_bcast_data(name, batched):
    c = get(name, batched_copy=batched)
    m = _model(c.rank, dtype=numpy.float32)
    c.bcast_data(m)
    ref = _model(0)
    for k, p in m.namedparams():
        numpy.testing.assert_array_equal(p.array.get(), ref._p[k].array.get())


@pytest.mark.parametrize('name', NAMES)
@pytest.mark.parametrize('dtype', [numpy.float32, numpy.float16, numpy.int32, numpy.float64])
def test_allreduce(name, dtype):
    c = get(name)
    x = cupy.arange(10, dtype=dtype) + c.rank
    y = c.allreduce(x)
    assert isinstance(y, cupy.ndarray) and y.dtype == numpy.dtype(dtype)
    want = numpy.arange(10) * c.size + c.size * (c.size - 1) // 2
    numpy.testing.assert_allclose(y.get().astype(numpy.float64), want)
    assert c.allreduce(cupy.asarray([c.rank], numpy.int64), op='max').get().tolist() == [c.size - 1]
    assert c.allreduce(cupy.asarray([c.rank + 1.0]), op='prod').get().tolist() == [
        float(numpy.prod(numpy.arange(1, c.size + 1)))]
    numpy.testing.assert_array_equal(x.get(), numpy.arange(10) + c.rank)  # input untouched


@pytest.mark.parametrize('name', NAMES)
def test_bcast(name):
    c = get(name)
    for root in range(c.size):
        x = cupy.arange(12, dtype=numpy.float32).reshape(3, 4) * (root + 1) if c.rank == root else None
        y = c.bcast(x, root=root)
        assert isinstance(y, cupy.ndarray) and y.shape == (3, 4)
        numpy.testing.assert_array_equal(y.get(), numpy.arange(12).reshape(3, 4) * (root + 1))
    z = c.bcast(numpy.arange(5, dtype=numpy.int16) if c.rank == 0 else None, max_buf_len=4)
    assert isinstance(z, numpy.ndarray) and z.tolist() == list(range(5))


@pytest.mark.parametrize('name', NAMES)
def test_send_recv(name):
    c = get(name)
    if c.size == 1:
        pytest.skip('send/recv needs 2 ranks')
    if c.rank == 0:
        c.send(cupy.arange(6, dtype=numpy.float32).reshape(2, 3), dest=1, tag=3)
        c.send((cupy.ones(2, numpy.int8), numpy.zeros(3)), dest=1, tag=4)
    elif c.rank == 1:
        y = c.recv(0, 3)
        assert isinstance(y, cupy.ndarray) and y.get().tolist() == [[0, 1, 2], [3, 4, 5]]
        a, b = c.recv(0, 4)
        assert isinstance(a, cupy.ndarray) and a.get().tolist() == [1, 1]
        assert isinstance(b, numpy.ndarray) and b.tolist() == [0, 0, 0]


@pytest.mark.parametrize('name', NAMES)
def test_gather_allgather_scatter_alltoall(name):
    c = get(name)
    x = cupy.full((2,), c.rank, numpy.float32)
    g = c.gather(x, root=0)
    if c.rank == 0:
        assert g.shape == (c.size, 2) and g[:, 0].get().tolist() == list(range(c.size))
    else:
        assert g is None
    ys = c.allgather(cupy.arange(c.rank + 1, dtype=numpy.float32))
    assert len(ys) == c.size
    for r, y in enumerate(ys):
        assert isinstance(y, cupy.ndarray) and y.get().tolist() == list(range(r + 1))
    xs = [cupy.full((3,), 10 * i, numpy.int32) for i in range(c.size)] if c.rank == 0 else None
    s = c.scatter(xs, root=0)
    assert isinstance(s, cupy.ndarray) and s.get().tolist() == [10 * c.rank] * 3
    outs = c.alltoall([cupy.full((1,), 100 * c.rank + j, numpy.float32) for j in range(c.size)])
    assert [float(o.get()[0]) for o in outs] == [100 * j + c.rank for j in range(c.size)]


@pytest.mark.parametrize('name', NAMES)
def test_objects_and_split(name):
    c = get(name)
    assert c.bcast_obj({'a': c.rank}, root=0) == {'a': 0}
    got = c.gather_obj(c.rank, root=0)
    assert got == (list(range(c.size)) if c.rank == 0 else None)
    assert c.allreduce_obj(c.rank + 1) == c.size * (c.size + 1) // 2
    if c.size > 1:
        if c.rank == 0:
            c.send_obj(('x', 1), dest=1, tag=9)
        elif c.rank == 1:
            assert c.recv_obj(0, 9) == ('x', 1)
    sub = c.split(c.rank % 2, c.rank)
    assert type(sub) is type(c) and sub.size == len(range(c.rank % 2, c.size, 2))
    y = sub.allreduce(cupy.ones(3, numpy.float32))
    assert y.get().tolist() == [sub.size] * 3


@pytest.mark.parametrize('name', NAMES)
def test_wrong_device_is_rejected(name):
    c = get(name)
    if cupy.cuda.runtime.getDeviceCount() < 2:
        pytest.skip('needs 2 GPUs')
    other = (cupy.cuda.runtime.getDevice() + 1) % cupy.cuda.runtime.getDeviceCount()
    with cupy.cuda.Device(other):
        x = cupy.ones(3)
    with pytest.raises(ValueError, match='current device'):
        c.allreduce(x)
