"""Per-rank tests of ``comm_hook`` on the multi-node optimizer (run by test_hooks_train_mpi.py).

The built-in hooks train to the same bits as the communicator's ``allreduce_grad_dtype`` on the
plain path, with ``overlap=True`` and with double buffering; PowerSGD keeps every rank's
parameters identical after each update, per bucket with ``overlap=True`` too; a user's hook works.
"""

import chainer
import chainer.functions as F
import chainer.links as L
import numpy
import pytest

import chainermn_comm
from chainermn_comm import hooks
from chainermn_train import create_multi_node_optimizer

#: Small buckets: overlap=True averages the model in several of them.
BUCKET_ENV = {'CHAINERMN_OVERLAP_BUCKET_BYTES': '256'}


class Net(chainer.Chain):
    def __init__(self):
        super().__init__()
        with self.init_scope():
            self.c1 = L.Convolution2D(2, 6, 3, initialW=chainer.initializers.Normal(0.5, numpy.float32))
            self.l1 = L.Linear(6 * 4 * 4, 12, initialW=chainer.initializers.Normal(0.2, numpy.float32))
            self.l2 = L.Linear(12, 3, initialW=chainer.initializers.Normal(0.5, numpy.float32))

    def __call__(self, x):
        return self.l2(F.tanh(self.l1(F.relu(self.c1(x)))))


def _batch(comm, step):
    rng = numpy.random.RandomState(100 * step + comm.rank)
    x = rng.standard_normal((4, 2, 6, 6)).astype(numpy.float32)
    t = rng.randint(0, 3, 4).astype(numpy.int32)
    return x, t


def _train(comm, steps=4, seed=0, **kwargs):
    """Train a fresh Net for ``steps`` updates; return its parameters after each update."""
    numpy.random.seed(seed)
    model = Net()
    opt = create_multi_node_optimizer(chainer.optimizers.MomentumSGD(lr=0.05), comm, **kwargs)
    opt.setup(model)
    history = []
    for step in range(steps):
        x, t = _batch(comm, step)
        opt.update(lambda x, t: F.softmax_cross_entropy(model(x), t), x, t)
        history.append({n: p.array.copy() for n, p in sorted(model.namedparams())})
    opt.finish() if kwargs.get('double_buffering') else None
    return history, opt


def _identical(a, b):
    for step, (pa, pb) in enumerate(zip(a, b)):
        for name in pa:
            assert pa[name].tobytes() == pb[name].tobytes(), (name, step)


def _same_on_every_rank(comm, params):
    mine = numpy.concatenate([params[n].reshape(-1) for n in sorted(params)])
    rows = comm.mpi_comm.allgather(mine)
    for r, row in enumerate(rows):
        assert row.tobytes() == rows[0].tobytes(), 'rank {} holds other parameters than rank 0'.format(r)


@pytest.mark.parametrize('wire,hook', [(None, hooks.Exact), (numpy.float16, hooks.Float16),
                                       ('bfloat16', hooks.BFloat16)])
@pytest.mark.parametrize('how', ['plain', 'overlap', 'double_buffering'])
def test_builtin_hooks_train_like_allreduce_grad_dtype(wire, hook, how, monkeypatch):
    for k, v in BUCKET_ENV.items():
        monkeypatch.setenv(k, v)
    kwargs = {'overlap': how == 'overlap', 'double_buffering': how == 'double_buffering'}
    own = chainermn_comm.create_communicator('naive', allreduce_grad_dtype=wire)
    want, _ = _train(own, **kwargs)
    plain = chainermn_comm.create_communicator('naive')
    got, opt = _train(plain, comm_hook=hook(), **kwargs)
    assert isinstance(opt.comm_hook, hook)
    _identical(got, want)
    # allreduce_grad_dtype values passed as comm_hook map to the same built-in hook.
    got2, opt2 = _train(plain, comm_hook=wire if wire is not None else hooks.Exact(), **kwargs)
    assert type(opt2.comm_hook) is hook
    _identical(got2, want)
    own.finalize()
    plain.finalize()


@pytest.mark.parametrize('overlap', [False, True])
def test_powersgd_keeps_parameters_identical_on_every_rank(overlap, monkeypatch):
    for k, v in BUCKET_ENV.items():
        monkeypatch.setenv(k, v)
    comm = chainermn_comm.create_communicator('naive')
    hook = hooks.PowerSGD(rank=2, start_update=1, min_compression=1.0)
    history, opt = _train(comm, steps=5, comm_hook=hook, overlap=overlap)
    for params in history:
        _same_on_every_rank(comm, params)
    assert hook.updates == 5 and len(hook._error) == 3  # c1/W, l1/W, l2/W compressed
    if overlap and comm.size > 1:  # one rank: overlap=True runs the plain path
        assert len(opt._overlap._layout.buckets) > 1  # the hook was called per bucket
        plain, _ = _train(comm, steps=5, comm_hook=hooks.PowerSGD(rank=2, start_update=1,
                                                                  min_compression=1.0))
        for pa, pb in zip(history, plain):  # the same arithmetic, grouped in other all-reduces
            for name in pa:
                numpy.testing.assert_allclose(pa[name], pb[name], rtol=1e-4, atol=1e-5, err_msg=name)
    comm.finalize()


def test_user_hook_on_the_optimizer(monkeypatch):
    for k, v in BUCKET_ENV.items():
        monkeypatch.setenv(k, v)
    comm = chainermn_comm.create_communicator('naive')
    buckets = []

    def float64_mean(comm, bucket):
        buckets.append((bucket.index, bucket.count))
        hooks.mean(comm, bucket.grads, numpy.float64)

    want, _ = _train(comm, steps=2)
    got, _ = _train(comm, steps=2, comm_hook=float64_mean)
    for pa, pb in zip(got, want):
        for name in pa:
            numpy.testing.assert_allclose(pa[name], pb[name], rtol=1e-5, atol=1e-6)
    assert buckets == [(0, 1), (0, 1)]
    del buckets[:]
    _train(comm, steps=1, comm_hook=float64_mean, overlap=True)
    assert [b for b, _ in buckets] == list(range(len(buckets)))
    assert len(buckets) > 1 if comm.size > 1 else buckets == [(0, 1)]  # one rank: the plain path
    with pytest.raises(ValueError, match='double_buffering'):
        create_multi_node_optimizer(chainer.optimizers.SGD(), comm, double_buffering=True,
                                    comm_hook=hooks.PowerSGD())
    comm.finalize()


def test_a_stateful_hook_serves_one_optimizer():
    """One PowerSGD given to a second optimizer is refused, naming the hook (issue 55 item 8)."""
    import gc
    comm = chainermn_comm.create_communicator('naive')
    hook = hooks.PowerSGD(rank=2)
    first = create_multi_node_optimizer(chainer.optimizers.SGD(lr=0.1), comm, comm_hook=hook)
    with pytest.raises(ValueError, match=r'the communication hook <PowerSGD powersgd-r2> already '
                                         r'serves another multi-node optimizer .*give each optimizer its own'):
        create_multi_node_optimizer(chainer.optimizers.Adam(), comm, comm_hook=hook)
    # Stateless hooks (the built-in wires, functions) may serve several optimizers.
    wire = hooks.Float16()
    for _ in range(2):
        create_multi_node_optimizer(chainer.optimizers.SGD(lr=0.1), comm, comm_hook=wire)
    auto = hooks.Auto()
    create_multi_node_optimizer(chainer.optimizers.SGD(lr=0.1), comm, comm_hook=auto)
    create_multi_node_optimizer(chainer.optimizers.SGD(lr=0.1), comm, comm_hook=auto)
    # Once the first optimizer is gone, the hook may serve a new one (a job that rebuilds it).
    del first
    gc.collect()
    create_multi_node_optimizer(chainer.optimizers.SGD(lr=0.1), comm, comm_hook=hook)
    comm.finalize()


def test_a_communicator_class_that_overrides_the_average_is_used():
    """Chainer v7's rule: a subclass's multi_node_mean_grad (or older allreduce_grad) averages."""
    from chainermn_comm.naive import NaiveCommunicator
    calls = []

    class Mine(NaiveCommunicator):
        def multi_node_mean_grad(self, model, zero_fill=True):
            calls.append(('multi_node_mean_grad', zero_fill))
            super().multi_node_mean_grad(model, zero_fill)

    class Older(NaiveCommunicator):
        def allreduce_grad(self, model, zero_fill=True):
            calls.append(('allreduce_grad', zero_fill))
            super().allreduce_grad(model, zero_fill)

    plain = chainermn_comm.create_communicator('naive')
    want, _ = _train(plain, steps=2)
    plain.finalize()
    for cls in (Mine, Older):
        del calls[:]
        comm = cls()
        got, opt = _train(comm, steps=2)
        assert [c[0] for c in calls] == [cls.__name__ == 'Mine' and 'multi_node_mean_grad'
                                         or 'allreduce_grad'] * 2, calls
        assert opt._mn_avg.strategy == 'communicator'
        _identical(got, want)
        comm.finalize()
