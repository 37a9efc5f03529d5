"""Per-rank tests: MultiNodeBatchNormalization equals chainer's BatchNormalization on the global batch."""

import chainer
import chainer.functions as F
import chainer.links as L
import numpy
import pytest

import chainermn_comm
from chainermn_links.links import MultiNodeBatchNormalization, create_mnbn_model
from chainermn_links.links.batch_normalization import select_backend

comm = chainermn_comm.create_communicator('naive')
RANK, SIZE = comm.rank, comm.size
COUNTS = [r + 2 for r in range(SIZE)]        # local batch sizes differ per rank
START = sum(COUNTS[:RANK])
LOCAL = slice(START, START + COUNTS[RANK])


def global_batch(shape_tail, seed, dtype):
    rng = numpy.random.RandomState(seed)
    n = sum(COUNTS)
    x = (rng.uniform(-1, 1, (n,) + shape_tail) * 3 + 0.5).astype(dtype)
    w = rng.uniform(-1, 1, (n,) + shape_tail).astype(dtype)
    return x, w


def allsum(a):
    return comm.allreduce(numpy.ascontiguousarray(a))


@pytest.mark.parametrize('dtype,tol', [(numpy.float64, 1e-10), (numpy.float32, 1e-5)])
@pytest.mark.parametrize('tail', [(3,), (2, 3, 2), (2, 2, 4)])
@pytest.mark.parametrize('use_gamma,use_beta', [(True, True), (False, True), (True, False)])
def test_matches_single_process(dtype, tol, tail, use_gamma, use_beta):
    size = tail[:2] if tail == (2, 2, 4) else tail[0]   # a 2-d channel shape in the last case
    init_g = numpy.random.RandomState(7).uniform(0.5, 1.5, size).astype(dtype)
    init_b = numpy.random.RandomState(8).uniform(-1, 1, size).astype(dtype)
    ref = L.BatchNormalization(size, dtype=dtype, use_gamma=use_gamma, use_beta=use_beta,
                               initial_gamma=init_g, initial_beta=init_b)
    mn = MultiNodeBatchNormalization(size, comm, dtype=dtype, use_gamma=use_gamma, use_beta=use_beta,
                                     initial_gamma=init_g, initial_beta=init_b)
    for it in range(3):
        xg, wg = global_batch(tail, seed=10 + it, dtype=dtype)
        xr = chainer.Variable(xg.copy())
        yr = ref(xr)
        F.sum(yr * wg).backward()
        xm = chainer.Variable(xg[LOCAL].copy())
        ym = mn(xm)
        F.sum(ym * wg[LOCAL]).backward()
        assert ym.dtype == dtype
        numpy.testing.assert_allclose(ym.array, yr.array[LOCAL], rtol=tol, atol=tol)
        numpy.testing.assert_allclose(xm.grad, xr.grad[LOCAL], rtol=tol, atol=tol)
        if use_gamma:
            numpy.testing.assert_allclose(allsum(mn.gamma.grad), ref.gamma.grad, rtol=tol, atol=tol)
        if use_beta:
            numpy.testing.assert_allclose(allsum(mn.beta.grad), ref.beta.grad, rtol=tol, atol=tol)
        numpy.testing.assert_allclose(mn.avg_mean, ref.avg_mean, rtol=tol, atol=tol)
        numpy.testing.assert_allclose(mn.avg_var, ref.avg_var, rtol=tol, atol=tol)
        ref.cleargrads()
        mn.cleargrads()
    # Test mode: running statistics, no communication.
    xg, _ = global_batch(tail, seed=99, dtype=dtype)
    with chainer.using_config('train', False):
        numpy.testing.assert_allclose(mn(xg[LOCAL]).array, ref(xg).array[LOCAL], rtol=tol, atol=tol)


def test_finetune_and_decay_match():
    ref = L.BatchNormalization(4, decay=0.7, eps=1e-3, dtype=numpy.float64)
    mn = MultiNodeBatchNormalization(4, comm, decay=0.7, eps=1e-3, dtype=numpy.float64)
    for it in range(3):
        xg, _ = global_batch((4,), seed=30 + it, dtype=numpy.float64)
        ref(xg, finetune=(it > 0))
        mn(xg[LOCAL], finetune=(it > 0))
        assert mn.N == ref.N
        numpy.testing.assert_allclose(mn.avg_mean, ref.avg_mean, rtol=1e-12)
        numpy.testing.assert_allclose(mn.avg_var, ref.avg_var, rtol=1e-12)


class Net(chainer.Chain):
    def __init__(self):
        super().__init__()
        with self.init_scope():
            self.l1 = L.Linear(3, 4)
            self.bn1 = L.BatchNormalization(4)
            self.seq = chainer.ChainList(L.Linear(4, 4), L.BatchNormalization(4, use_beta=False))

    def forward(self, x):
        h = F.relu(self.bn1(self.l1(x)))
        return self.seq[1](self.seq[0](h))


def test_create_mnbn_model_replaces_and_matches():
    chainer.global_config.dtype = numpy.dtype(numpy.float32)
    numpy.random.seed(0)
    ref = Net()
    ref.bn1.avg_mean[...] = 0.25
    mn = create_mnbn_model(ref, comm)
    assert isinstance(ref.bn1, L.BatchNormalization)               # original untouched
    assert isinstance(mn.bn1, MultiNodeBatchNormalization)
    assert isinstance(mn.seq[1], MultiNodeBatchNormalization)
    assert 'beta' not in dict(mn.seq[1].namedparams()) and not mn.seq[1].use_beta
    numpy.testing.assert_array_equal(mn.bn1.avg_mean, ref.bn1.avg_mean)
    assert sorted(n for n, _ in mn.namedparams()) == sorted(n for n, _ in ref.namedparams())
    xg, _ = global_batch((3,), seed=50, dtype=numpy.float32)
    _, wg = global_batch((4,), seed=51, dtype=numpy.float32)
    yr = ref(xg)
    F.sum(yr * wg).backward()
    ym = mn(xg[LOCAL])
    F.sum(ym * wg[LOCAL]).backward()
    numpy.testing.assert_allclose(ym.array, yr.array[LOCAL], rtol=1e-5, atol=1e-5)
    for (name, pr), (_, pm) in zip(sorted(ref.namedparams()), sorted(mn.namedparams())):
        numpy.testing.assert_allclose(allsum(pm.grad), pr.grad, rtol=1e-4, atol=1e-5, err_msg=name)
    single = create_mnbn_model(L.BatchNormalization(3), comm)
    assert isinstance(single, MultiNodeBatchNormalization)


def test_communication_backend_choice():
    assert MultiNodeBatchNormalization(3, comm).communication_backend == 'mpi'
    assert MultiNodeBatchNormalization(3, comm, communication_backend='mpi').communication_backend == 'mpi'
    with pytest.raises(ValueError, match="communication_backend='nccl' needs a communicator that uses NCCL"):
        MultiNodeBatchNormalization(3, comm, communication_backend='nccl')
    with pytest.raises(ValueError, match='must be one of'):
        MultiNodeBatchNormalization(3, comm, communication_backend='gloo')


def test_deepcopy_shares_communicator():
    import copy
    mn = MultiNodeBatchNormalization(3, comm)
    c = copy.deepcopy(mn)
    assert c.comm is comm and c.gamma is not mn.gamma


def test_dtype_none_follows_config_dtype():
    with chainer.using_config('dtype', numpy.float16):
        mn = MultiNodeBatchNormalization(3, comm)
        ref = L.BatchNormalization(3)
        explicit = MultiNodeBatchNormalization(3, comm, dtype=numpy.float64)
    for link in (mn, ref):
        assert link.gamma.dtype == numpy.float16 and link.beta.dtype == numpy.float16
        assert link.avg_mean.dtype == numpy.float16 and link.avg_var.dtype == numpy.float16
    assert explicit.gamma.dtype == numpy.float64 and explicit.avg_mean.dtype == numpy.float64
    with chainer.using_config('dtype', numpy.float64):
        assert MultiNodeBatchNormalization(3, comm).gamma.dtype == numpy.float64
        assert MultiNodeBatchNormalization(3, comm, dtype=numpy.float32).gamma.dtype == numpy.float32
    with chainer.using_config('dtype', chainer.mixed16):
        # mixed16 keeps parameters and statistics in float32, as chainer's BatchNormalization does
        assert MultiNodeBatchNormalization(3, comm).avg_var.dtype == numpy.float32
    # float16 statistics train like chainer's own float16 BatchNormalization on the global batch.
    xg, wg = global_batch((3,), seed=60, dtype=numpy.float16)
    yr = ref(chainer.Variable(xg.copy()))
    F.sum(yr * wg).backward()
    ym = mn(chainer.Variable(xg[LOCAL].copy()))
    F.sum(ym * wg[LOCAL]).backward()
    assert ym.dtype == numpy.float16 and mn.gamma.grad.dtype == numpy.float16
    numpy.testing.assert_allclose(ym.array.astype(numpy.float64), yr.array[LOCAL], rtol=1e-2, atol=1e-2)
    numpy.testing.assert_allclose(allsum(mn.gamma.grad.astype(numpy.float32)), ref.gamma.grad,
                                  rtol=2e-2, atol=2e-2)
    numpy.testing.assert_allclose(mn.avg_mean, ref.avg_mean, rtol=1e-2, atol=1e-2)
    numpy.testing.assert_allclose(mn.avg_var, ref.avg_var, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize('tail', [(3,), (2, 3, 2)])
def test_mixed16_keeps_float32_parameters_and_matches_single_process(tail):
    # Chainer v7 and chainer.links.BatchNormalization: under mixed16 gamma, beta and the running
    # statistics are float32; input, output and the input's gradient are float16.
    size = tail[0]
    with chainer.using_config('dtype', chainer.mixed16):
        ref = L.BatchNormalization(size)
        mn = MultiNodeBatchNormalization(size, comm)
        half = MultiNodeBatchNormalization(size, comm, dtype=numpy.float16)   # explicit dtype wins
        for link in (ref, mn):
            assert link.gamma.dtype == link.beta.dtype == numpy.float32
            assert link.avg_mean.dtype == link.avg_var.dtype == numpy.float32
        assert half.gamma.dtype == half.avg_mean.dtype == numpy.float16
        for it in range(3):
            xg, wg = global_batch(tail, seed=70 + it, dtype=numpy.float16)
            xr = chainer.Variable(xg.copy())
            yr = ref(xr)
            F.sum(F.cast(yr, numpy.float32) * wg.astype(numpy.float32)).backward()
            xm = chainer.Variable(xg[LOCAL].copy())
            ym = mn(xm)
            F.sum(F.cast(ym, numpy.float32) * wg[LOCAL].astype(numpy.float32)).backward()
            assert ym.dtype == numpy.float16 and xm.grad.dtype == numpy.float16
            assert mn.gamma.grad.dtype == mn.beta.grad.dtype == numpy.float32
            assert mn.avg_mean.dtype == mn.avg_var.dtype == numpy.float32
            numpy.testing.assert_allclose(ym.array.astype(numpy.float32), yr.array[LOCAL], rtol=1e-2, atol=1e-2)
            numpy.testing.assert_allclose(xm.grad.astype(numpy.float32), xr.grad[LOCAL], rtol=1e-2, atol=1e-2)
            numpy.testing.assert_allclose(allsum(mn.gamma.grad), ref.gamma.grad, rtol=1e-3, atol=1e-3)
            numpy.testing.assert_allclose(allsum(mn.beta.grad), ref.beta.grad, rtol=1e-3, atol=1e-3)
            numpy.testing.assert_allclose(mn.avg_mean, ref.avg_mean, rtol=1e-3, atol=1e-3)
            numpy.testing.assert_allclose(mn.avg_var, ref.avg_var, rtol=1e-3, atol=1e-3)
            ref.cleargrads()
            mn.cleargrads()
        with chainer.using_config('train', False):
            xg, _ = global_batch(tail, seed=99, dtype=numpy.float16)
            yt = mn(xg[LOCAL])
            assert yt.dtype == numpy.float16
            numpy.testing.assert_allclose(yt.array.astype(numpy.float32), ref(xg).array[LOCAL],
                                          rtol=1e-2, atol=1e-2)


def test_mixed16_create_mnbn_model_keeps_float32():
    numpy.random.seed(4)   # the same Linear weights on every rank
    with chainer.using_config('dtype', chainer.mixed16):
        model = chainer.ChainList(L.Linear(3, 4), L.BatchNormalization(4))
        mn = create_mnbn_model(model, comm)
        assert isinstance(mn[1], MultiNodeBatchNormalization)
        assert mn[1].gamma.dtype == mn[1].avg_var.dtype == numpy.float32
        assert mn[0].W.dtype == numpy.float16
        xg, _ = global_batch((3,), seed=80, dtype=numpy.float16)
        y = mn[1](mn[0](xg[LOCAL]))
        assert y.dtype == numpy.float16
        numpy.testing.assert_allclose(y.array.astype(numpy.float32), model[1](model[0](xg)).array[LOCAL],
                                      rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize('backend', ['auto', 'mpi'])
def test_backends_train_like_single_process(backend):
    # 'auto' and 'mpi' (v7 accepts both with every communicator) run to the same result; no hang.
    ref = L.BatchNormalization(3, dtype=numpy.float64)
    mn = MultiNodeBatchNormalization(3, comm, dtype=numpy.float64, communication_backend=backend)
    assert mn.communication_backend == 'mpi'
    for it in range(2):
        xg, wg = global_batch((3,), seed=90 + it, dtype=numpy.float64)
        xr = chainer.Variable(xg.copy())
        F.sum(ref(xr) * wg).backward()
        xm = chainer.Variable(xg[LOCAL].copy())
        F.sum(mn(xm) * wg[LOCAL]).backward()
        numpy.testing.assert_allclose(xm.grad, xr.grad[LOCAL], rtol=1e-10, atol=1e-12)
        numpy.testing.assert_allclose(allsum(mn.gamma.grad), ref.gamma.grad, rtol=1e-10, atol=1e-12)
        numpy.testing.assert_allclose(mn.avg_var, ref.avg_var, rtol=1e-12)
        ref.cleargrads()
        mn.cleargrads()


@pytest.mark.parametrize('value', [None, 'MPI', 'dummy', '', 1])
def test_communication_backend_other_values_are_refused(value):
    # v7 raises ValueError for every value but 'auto', 'mpi' and 'nccl' (case matters)
    with pytest.raises(ValueError, match="MultiNodeBatchNormalization: communication_backend must be one of "
                                         "'auto', 'mpi', 'nccl'; got {}".format(repr(value))):
        MultiNodeBatchNormalization(3, comm, communication_backend=value)
    with pytest.raises(ValueError, match='must be one of'):
        create_mnbn_model(L.BatchNormalization(3), comm, communication_backend=value)


class _StandIn:
    """Just what select_backend reads of a communicator: its name (and maybe uses_nccl)."""

    def __init__(self, name, **kw):
        self.name = name
        self.__dict__.update(kw)


@pytest.mark.parametrize('name,nccl', [('naive', False), ('flat', False), ('pure_nccl', True),
                                       ('hierarchical', True), ('two_dimensional', True),
                                       ('single_node', True), ('non_cuda_aware', True)])
def test_backend_for_each_communicator_kind(name, nccl):
    c = _StandIn(name)
    assert select_backend(c, 'auto') == ('nccl' if nccl else 'mpi')
    assert select_backend(c, 'mpi') == 'mpi'            # v7: 'mpi' works with every communicator
    if nccl:
        assert select_backend(c, 'nccl') == 'nccl'
    else:
        with pytest.raises(ValueError, match="communication_backend='nccl' needs a communicator that "
                                             "uses NCCL.*name {!r}".format(name)):
            select_backend(c, 'nccl')
    assert select_backend(_StandIn('custom', uses_nccl=True), 'nccl') == 'nccl'
