"""Run under mpiexec with one GPU per rank: the side-stream overlap against the plain device path."""

import chainer
import chainer.functions as F
import chainer.links as L
import numpy
import pytest

import chainermn_comm
from chainermn_comm.gpu import _nccl
from chainermn_train._overlap import BackwardOverlap

cupy = pytest.importorskip('cupy')


class Deep(chainer.Chain):
    def __init__(self, width=256, depth=6):
        super().__init__()
        self.depth = depth
        with self.init_scope():
            for k in range(depth):
                setattr(self, 'l{}'.format(k), L.Linear(width, width))
            self.unused = L.Linear(3, 2)

    def __call__(self, x):
        h = x
        for k in range(self.depth):
            h = F.relu(getattr(self, 'l{}'.format(k))(h)) + h
        return h


class Spy(chainer.function_node.FunctionNode):
    """Identity whose backward (run last: it sits next to the input) records the NCCL calls so far."""

    def __init__(self, calls, seen):
        self.calls, self.seen = calls, seen

    def forward(self, inputs):
        return inputs[0].copy(),

    def backward(self, indexes, grad_outputs):
        self.seen.append(len(self.calls))
        return grad_outputs


def _setup():
    comm = chainermn_comm.create_communicator('pure_nccl')
    cupy.cuda.Device(comm.intra_rank).use()
    return comm


def _models(comm, seed=0):
    a = Deep()
    a.to_gpu()
    comm.bcast_data(a)
    b = a.copy(mode='copy')
    rs = numpy.random.RandomState(seed + comm.rank)
    x = cupy.asarray(rs.standard_normal((32, 256)).astype(numpy.float32))
    return a, b, x


def test_same_bits_as_the_plain_device_path():
    comm = _setup()
    a, b, x = _models(comm)
    a.cleargrads()
    F.sum(a(x) ** 2).backward()
    comm.multi_node_mean_grad(a, zero_fill=True)
    ov = BackwardOverlap(comm, b, bucket_bytes=256 * 256 * 4)  # about one layer per bucket
    for _ in range(2):  # the second call reuses the layout and the flat buffer
        b.cleargrads()
        ov.run_backward(F.sum(b(x) ** 2))
        pa, pb = dict(a.namedparams()), dict(b.namedparams())
        for name in pa:
            ga, gb = cupy.asnumpy(pa[name].grad), cupy.asnumpy(pb[name].grad)
            assert ga.dtype == gb.dtype and ga.shape == gb.shape, name
            if comm.size <= 2:
                assert numpy.array_equal(ga, gb), name
            else:  # NCCL may sum a bucket in another order than the whole buffer
                numpy.testing.assert_allclose(gb, ga, rtol=1e-6, atol=1e-7, err_msg=name)
        assert not cupy.asnumpy(pb['/unused/W'].grad).any()
        assert isinstance(pb['/l0/W'].grad, cupy.ndarray)
    assert ov.early_params >= 6  # the six layers' gradients were reported during backward
    ov.free()


def test_values_are_the_mean_over_ranks():
    comm = _setup()
    _, b, x = _models(comm, seed=5)
    ov = BackwardOverlap(comm, b, bucket_bytes=64 * 1024)
    b.cleargrads()
    ov.run_backward(F.sum(b(x)) * (comm.rank + 1))
    mine = cupy.asnumpy(b.l0.b.grad)
    every = comm.mpi_comm.allgather(mine)
    for other in every:
        assert numpy.array_equal(other, mine)  # every rank has the same bits
    # Against the mean of every rank's own gradient (computed here without any averaging).
    a = b.copy(mode='copy')
    a.cleargrads()
    (F.sum(a(x)) * (comm.rank + 1)).backward()
    own = comm.mpi_comm.allgather(cupy.asnumpy(a.l0.b.grad))
    numpy.testing.assert_allclose(mine, sum(own) / comm.size, rtol=1e-5, atol=1e-6)
    ov.free()


def test_nccl_starts_before_backward_ends(monkeypatch):
    comm = _setup()
    _, b, x = _models(comm, seed=7)
    calls, seen = [], []
    real = _nccl.NcclGroup.allreduce_async

    def counting(self, *args, **kwargs):
        calls.append(kwargs.get('what'))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(_nccl.NcclGroup, 'allreduce_async', counting)
    ov = BackwardOverlap(comm, b, bucket_bytes=256 * 256 * 4)
    b.cleargrads()
    xv = chainer.Variable(x)
    (h,) = Spy(calls, seen).apply((xv,))
    ov.run_backward(F.sum(b(h) ** 2))
    assert seen and seen[0] > 0, 'no bucket was all-reduced before backward reached the input'
    assert len(calls) > seen[0]  # the bucket of the unused link completes only after backward
    ov.free()
