"""Code written for Chainer v7's chainermn, on every rank (run by test_v7_clients_mpi.py).

v7's module paths, its direct constructors (the same communicator ``create_communicator`` gives,
set-up and checks and all), ``DummyCommunicator``, and a user's subclass of ``MpiCommunicatorBase``
that ``create_multi_node_optimizer`` uses.
"""

import chainer
import chainer.functions as F
import numpy
import pytest
from mpi4py import MPI

import chainermn
from chainermn.communicators.communicator_base import CommunicatorBase
from chainermn.communicators.dummy_communicator import DummyCommunicator
from chainermn.communicators.flat_communicator import FlatCommunicator
from chainermn.communicators.mpi_communicator_base import MpiCommunicatorBase
from chainermn.communicators.naive_communicator import NaiveCommunicator
from chainermn.communicators.non_cuda_aware_communicator import NonCudaAwareCommunicator
from chainermn.communicators.pure_nccl_communicator import PureNcclCommunicator
from chainermn_comm import CommunicatorUnavailableError, _gpu_support

WORLD = MPI.COMM_WORLD
RANK, SIZE = WORLD.Get_rank(), WORLD.Get_size()
ATTRS = ('rank', 'size', 'intra_rank', 'intra_size', 'inter_rank', 'inter_size', 'timeout',
         'allreduce_grad_dtype', 'batched_copy', 'name')


def _same(a, b):
    """Assert two communicators are alike: class, topology, settings, guard, and what they compute."""
    assert type(a) is type(b)
    assert [getattr(a, n) for n in ATTRS] == [getattr(b, n) for n in ATTRS]
    assert a.mpi_comm is b.mpi_comm
    ga, gb = a._guard, b._guard
    assert type(ga) is type(gb) and (ga.timeout, ga.check, ga.debug) == (gb.timeout, gb.check, gb.debug)
    x = numpy.arange(6, dtype=numpy.float32) * (RANK + 1)
    assert a.allreduce(x).tolist() == b.allreduce(x).tolist() == (numpy.arange(6) * SIZE * (SIZE + 1) / 2).tolist()
    assert a.bcast_obj({'r': RANK}, root=SIZE - 1) == b.bcast_obj({'r': RANK}, root=SIZE - 1) == {'r': SIZE - 1}
    assert a.allgather_obj(RANK) == b.allgather_obj(RANK) == list(range(SIZE))


def test_optuna_style_usage():
    comm = chainermn.create_communicator('naive')
    assert isinstance(comm, CommunicatorBase) and isinstance(comm, MpiCommunicatorBase)
    assert CommunicatorBase is chainermn.CommunicatorBase
    assert comm.mpi_comm.bcast('from 0' if comm.rank == 0 else None) == 'from 0'


def test_direct_constructors_give_what_create_communicator_gives():
    made = chainermn.create_communicator('naive', WORLD)
    for direct in (NaiveCommunicator(WORLD), NaiveCommunicator(mpi_comm=WORLD), NaiveCommunicator()):
        _same(direct, made)
    assert isinstance(made, NaiveCommunicator)
    # Their parts too.
    a, b = NaiveCommunicator(WORLD).split(RANK % 2, RANK), made.split(RANK % 2, RANK)
    assert type(a) is type(b) is NaiveCommunicator and (a.rank, a.size) == (b.rank, b.size)


def test_direct_constructor_checks_settings_on_every_rank_together(monkeypatch):
    if RANK == SIZE - 1:
        monkeypatch.setenv('CHAINERMN_TIMEOUT', 'soon')
    errors = []
    for make in (lambda: NaiveCommunicator(WORLD), lambda: chainermn.create_communicator('naive', WORLD),
                 lambda: DummyCommunicator(WORLD)):
        with pytest.raises(ValueError) as e:
            make()
        errors.append(str(e.value))
    assert all('CHAINERMN_TIMEOUT' in m for m in errors), errors
    assert errors[0] == errors[1] == errors[2]


@pytest.mark.skipif(_gpu_support.gpu_available(), reason='a GPU is available here')
@pytest.mark.parametrize('cls, name', [(FlatCommunicator, 'flat'), (PureNcclCommunicator, 'pure_nccl'),
                                       (NonCudaAwareCommunicator, 'non_cuda_aware')])
def test_gpu_classes_say_what_create_communicator_says_on_cpus(cls, name):
    with pytest.raises(CommunicatorUnavailableError) as direct:
        cls(WORLD)
    with pytest.raises(CommunicatorUnavailableError) as made:
        chainermn.create_communicator(name, WORLD)
    assert str(direct.value) == str(made.value) and "communicator '{}' needs".format(name) in str(made.value)


class _Net(chainer.Chain):
    def __init__(self):
        super().__init__()
        with self.init_scope():
            self.l = chainer.links.Linear(3, 1, initialW=0, initial_bias=0)


def _train_once(comm):
    """One SGD step (lr 0.1) of ``sum(l(x))`` with ``x`` = (rank + 1) in a batch of 2; return W, b."""
    model = _Net()
    opt = chainermn.create_multi_node_optimizer(chainer.optimizers.SGD(lr=0.1), comm)
    opt.setup(model)
    x = numpy.full((2, 3), RANK + 1, numpy.float32)
    opt.update(lambda x: F.sum(model.l(x)), x)
    return model.l.W.array.ravel().tolist(), model.l.b.array.tolist()


def test_dummy_communicator_communicates_no_gradient():
    made = chainermn.create_communicator('dummy', WORLD)
    _same(DummyCommunicator(WORLD), made)
    assert isinstance(made, MpiCommunicatorBase)
    # Every rank steps with its own gradient (W: 2 (rank + 1) per column, b: 2).
    w, b = _train_once(made)
    assert w == pytest.approx([-0.2 * (RANK + 1)] * 3) and b == pytest.approx([-0.2])
    model = _Net()
    model.cleargrads()
    made.multi_node_mean_grad(model)   # zero_fill: missing gradients become zeros, nothing is sent
    assert model.l.W.grad.tolist() == [[0.0, 0.0, 0.0]]


class SummingCommunicator(MpiCommunicatorBase):
    """A user's communicator as v7's docs show one: sums the gradients instead of averaging."""

    def __init__(self, mpi_comm):
        super().__init__(mpi_comm)
        self.calls = 0

    def multi_node_mean_grad(self, model, zero_fill=False):
        self.calls += 1
        for _, param in sorted(model.namedparams()):
            param.grad[...] = self.allreduce(param.grad)


class OldStyleCommunicator(MpiCommunicatorBase):
    """A user's communicator of the older API: overrides ``allreduce_grad`` only."""

    calls = 0

    def allreduce_grad(self, model, zero_fill=False):
        type(self).calls += 1
        for _, param in sorted(model.namedparams()):
            param.grad[...] = self.allreduce(param.grad) * 10


def test_user_subclass_is_what_the_multi_node_optimizer_uses():
    comm = SummingCommunicator(WORLD)
    assert isinstance(comm, CommunicatorBase) and comm.size == SIZE and comm._guard is not None
    w, b = _train_once(comm)
    assert comm.calls == 1
    total = SIZE * (SIZE + 1)   # sum over ranks of 2 (rank + 1)
    assert w == pytest.approx([-0.1 * total] * 3) and b == pytest.approx([-0.2 * SIZE])
    old = OldStyleCommunicator(WORLD)
    w, b = _train_once(old)
    assert OldStyleCommunicator.calls == 1
    assert w == pytest.approx([-1.0 * total] * 3) and b == pytest.approx([-2.0 * SIZE])
    # The built-in one averages: the reference values of the same step.
    w, b = _train_once(NaiveCommunicator(WORLD))
    assert w == pytest.approx([-0.1 * (SIZE + 1)] * 3) and b == pytest.approx([-0.2])


def test_scatter_index_and_v7_epoch_helpers():
    from chainermn.datasets.scatter import get_epoch_trigger, get_n_iterations_for_one_epoch, scatter_index
    comm = chainermn.create_communicator('naive', WORLD)
    for n in (0, 1, 10, 11):
        parts = comm.allgather_obj(scatter_index(n if RANK == 0 else None, comm))
        ceil = -(-n // SIZE)
        assert parts == [(n * r // SIZE, n * r // SIZE + ceil) for r in range(SIZE)]
        parts = comm.allgather_obj(scatter_index(n if RANK == SIZE - 1 else -5, comm, root=SIZE - 1,
                                                 force_equal_length=False))
        assert [i for b, e in parts for i in range(b, e)] == list(range(n))
        assert max(e - b for b, e in parts) - min(e - b for b, e in parts) <= 1
    with pytest.warns(DeprecationWarning):
        assert get_n_iterations_for_one_epoch(list(range(25 if RANK == 0 else 3)), 10, comm) == 3
    with pytest.warns(DeprecationWarning):
        assert get_epoch_trigger(4, list(range(25 if RANK == 0 else 3)), 10, comm) == (12, 'iteration')


def test_bn_impl_selector_normalizes_over_the_global_batch():
    from chainer.functions.normalization.batch_normalization import BatchNormalization
    from chainermn.functions.batch_normalization import MultiNodeBNImplSelector, get_communication_backend
    comm = chainermn.create_communicator('naive', WORLD)
    assert get_communication_backend(comm) == 'mpi'
    with pytest.raises(ValueError, match='nccl'):
        get_communication_backend(comm, 'nccl')
    every = [numpy.arange(8, dtype=numpy.float64).reshape(4, 2) * (r + 1) + r for r in range(SIZE)]
    x = chainer.Variable(every[RANK])
    gamma = chainer.Variable(numpy.array([1.0, 2.0]))
    beta = chainer.Variable(numpy.array([0.5, -0.5]))
    y, = BatchNormalization(eps=1e-5, impl_selector=MultiNodeBNImplSelector(comm, 'auto')).apply(
        (x, gamma, beta))
    whole = numpy.concatenate(every)
    want = (every[RANK] - whole.mean(0)) / numpy.sqrt(whole.var(0) + 1e-5) * gamma.array + beta.array
    assert y.array == pytest.approx(want, rel=1e-6)
    F.sum(y).backward()
    # v7's rule: the gradient sums are averaged over the ranks (sum over the rank's rows, then mean).
    assert beta.grad.tolist() == pytest.approx([4.0, 4.0])


def test_testing_get_device():
    from chainermn.testing import get_device
    assert get_device() is not None and str(get_device()) == '@numpy'


def test_v7_snapshot_test_module_paths_and_smoke():
    # Chainer v7's extensions_tests/test_multi_node_snapshot.py imports this private path.
    from unittest import mock

    from chainer.training import extensions
    from chainermn.extensions import _multi_node_snapshot, multi_node_snapshot
    assert _multi_node_snapshot._parse_replica_sets([0, 1], 4) == [{0}, {1}, {2, 3}]
    assert _multi_node_snapshot._parse_replica_sets([range(0, 16, 2)], 16) == [set(range(0, 16, 2)),
                                                                            set(range(1, 16, 2))]
    assert _multi_node_snapshot.multi_node_snapshot is multi_node_snapshot
    condition, writer = mock.MagicMock(side_effect=[True, False]), mock.MagicMock()
    snapshot = extensions.snapshot(target=mock.MagicMock(), condition=condition, writer=writer)
    trainer = mock.MagicMock()
    comm = chainermn.create_communicator('naive')
    ext = multi_node_snapshot(comm, snapshot, [])
    ext.initialize(trainer)
    ext(trainer)
    ext(trainer)
    ext.finalize()
    assert (condition.call_count, writer.call_count) == ((2, 1) if RANK == 0 else (0, 0))
    assert comm.allreduce_obj(1) == SIZE


#: The abstract methods of v7's ``CommunicatorBase``: what a v7 user's own communicator defines.
V7_ABSTRACT = ('allgather', 'allreduce', 'allreduce_obj', 'alltoall', 'bcast', 'bcast_data', 'bcast_obj',
               'gather', 'gather_obj', 'multi_node_mean_grad', 'recv', 'recv_obj', 'scatter', 'send',
               'send_obj', 'split')


def _v7_style_communicator(inner, calls):
    """A communicator written against v7's ``CommunicatorBase``: v7's abstract methods (delegated
    to ``inner``), its rank and size; nothing else."""
    def delegate(name):
        return lambda self, *args, **kwargs: getattr(inner, name)(*args, **kwargs)

    body = {name: delegate(name) for name in V7_ABSTRACT}
    body.update(rank=property(lambda self: inner.rank), size=property(lambda self: inner.size))

    def multi_node_mean_grad(self, model, zero_fill=False):
        calls.append(zero_fill)
        inner.multi_node_mean_grad(model, zero_fill)

    body['multi_node_mean_grad'] = multi_node_mean_grad
    return type('V7StyleCommunicator', (CommunicatorBase,), body)()


@pytest.mark.skipif('allreduce_grad' in CommunicatorBase.__abstractmethods__,
                    reason='CommunicatorBase still requires allreduce_grad (issue 50: multi_node_mean_grad '
                           'becomes the method a communicator implements)')
def test_v7_style_subclass_of_communicator_base_trains():
    calls = []
    comm = _v7_style_communicator(NaiveCommunicator(WORLD), calls)
    assert isinstance(comm, CommunicatorBase) and comm.size == SIZE
    assert comm.allgather_obj(RANK) == list(range(SIZE))   # the base's default, from v7's methods
    with pytest.raises(NotImplementedError, match='V7StyleCommunicator does not define intra_rank'):
        comm.intra_rank  # noqa: B018
    w, b = _train_once(comm)
    assert calls and w == pytest.approx([-0.1 * (SIZE + 1)] * 3) and b == pytest.approx([-0.2])
