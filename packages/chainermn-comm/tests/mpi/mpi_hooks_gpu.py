"""Per-rank tests of communication hooks on GPU communicators (CuPy gradients).

Run by test_hooks_gpu_emulated.py on the NumPy stand-in (fakecupy) and, where a GPU is present,
by test_hooks_gpu_emulated.py's ``gpu`` test.  $CHAINERMN_TEST_GPU_COMMS lists the communicators.
"""

import os

import numpy
import pytest

cupy = pytest.importorskip('cupy')

from chainermn_comm import create_communicator, hooks  # NOQA: E402

NAMES = [n for n in os.environ.get('CHAINERMN_TEST_GPU_COMMS', 'flat').split(',') if n]
SHAPES = (('a', (12, 5)), ('b', (7,)), ('c', (6, 3, 2, 2)), ('d', (4, 6)))
_comms = {}


def get(name, **kw):
    key = (name, tuple(sorted(kw.items())))
    if key not in _comms:
        from mpi4py import MPI
        rank = MPI.COMM_WORLD.Get_rank()
        cupy.cuda.Device(0 if cupy.cuda.runtime.getDeviceCount() == 1 else rank).use()
        _comms[key] = create_communicator(name, **kw)
    return _comms[key]


class _Dev:
    def __init__(self, xp):
        self.xp = xp


class _Param:
    def __init__(self, grad):
        self.array = grad.copy()
        self.grad = grad
        self.device = _Dev(cupy if isinstance(grad, cupy.ndarray) else numpy)


class _Model:
    def __init__(self, params):
        self._p = params

    def namedparams(self):
        return list(self._p.items())


def _model(rank, seed, device=True):
    rng = numpy.random.RandomState(1000 * seed + rank)
    params = {}
    for name, shape in SHAPES:
        g = rng.standard_normal(shape).astype(numpy.float32)
        params['/' + name] = _Param(cupy.asarray(g) if device else g)
    return _Model(params)


def _grads(model):
    return {k: (p.grad.get() if isinstance(p.grad, cupy.ndarray) else p.grad)
            for k, p in sorted(model.namedparams())}


@pytest.mark.parametrize('name', NAMES)
@pytest.mark.parametrize('wire,hook', [(None, hooks.Exact), (numpy.float16, hooks.Float16),
                                       ('bfloat16', hooks.BFloat16)])
def test_builtin_hooks_equal_the_device_path(name, wire, hook):
    own, plain = get(name, allreduce_grad_dtype=wire), get(name)
    for seed in range(2):
        a, b = _model(own.rank, seed), _model(own.rank, seed)
        own.multi_node_mean_grad(a)
        hooks.mean_model(plain, b, hook())
        for k, v in _grads(a).items():
            assert _grads(b)[k].tobytes() == v.tobytes(), (name, k, seed)


@pytest.mark.parametrize('name', NAMES)
def test_powersgd_on_device_gradients(name):
    c = get(name)
    host = get('naive') if name != 'naive' else c
    dev_hook = hooks.PowerSGD(rank=2, start_update=0, min_compression=1.0)
    host_hook = hooks.PowerSGD(rank=2, start_update=0, min_compression=1.0)
    for seed in range(3):
        d, h = _model(c.rank, seed), _model(c.rank, seed, device=False)
        hooks.mean_model(c, d, dev_hook)
        hooks.mean_model(host, h, host_hook)
        got, want = _grads(d), _grads(h)
        assert all(isinstance(p.grad, cupy.ndarray) for _, p in d.namedparams())
        rows = c.mpi_comm.allgather(numpy.concatenate([got[k].reshape(-1) for k in sorted(got)]))
        assert all(r.tobytes() == rows[0].tobytes() for r in rows), 'ranks differ'
        for k in want:  # the same arithmetic on the device (its all-reduce may add in another order)
            numpy.testing.assert_allclose(got[k], want[k], rtol=1e-4, atol=1e-5, err_msg=(name, k))
    assert isinstance(dev_hook._error['/a'], cupy.ndarray) and dev_hook.last['compressed'] == 3


@pytest.mark.parametrize('name', NAMES)
def test_powersgd_at_full_rank_on_device(name):
    c = get(name)
    hook = hooks.PowerSGD(rank=6, start_update=0, min_compression=0.01)
    m = _model(c.rank, 5)
    before = _grads(m)
    hooks.mean_model(c, m, hook)
    for k, v in _grads(m).items():
        rows = c.mpi_comm.allgather(before[k].astype(numpy.float64))
        numpy.testing.assert_allclose(v, sum(rows) / c.size, rtol=2e-4, atol=2e-5, err_msg=(name, k))
