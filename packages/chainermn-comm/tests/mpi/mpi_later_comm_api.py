"""Per-rank tests of finalize() and allreduce_grad(model, zero_fill) (run by test_later_comm_api.py).

$CHAINERMN_TEST_LATER_COMMS lists the communicators (default ``naive``); the GPU ones run on
the NumPy stand-in for CuPy (tests/fakecupy) in CI and on real GPUs where there are some.
"""

import os

import numpy
import pytest
from mpi4py import MPI

from chainermn_comm import (CommunicationError, CommunicatorBase, CommunicatorFinalizedError,
                            create_communicator)

NAMES = [n for n in os.environ.get('CHAINERMN_TEST_LATER_COMMS', 'naive').split(',') if n]
GPU = [n for n in NAMES if n != 'naive']


class _Param:
    def __init__(self, array, grad):
        self.array = array
        self.grad = grad


class _Model:
    def __init__(self, params):
        self._p = params

    def namedparams(self):
        return sorted(self._p.items())


def _xp(name):
    if name == 'naive':
        return numpy
    import cupy
    return cupy


def _new(name):
    if name != 'naive':
        import cupy
        rank = MPI.COMM_WORLD.Get_rank()
        cupy.cuda.Device(0 if cupy.cuda.runtime.getDeviceCount() == 1 else rank).use()
    return create_communicator(name)


def _model(xp, rank, n=3000):
    return _Model({'a': _Param(xp.zeros(n, numpy.float32), xp.full(n, rank + 1.0, numpy.float32)),
                   'b': _Param(xp.zeros((4, 5), numpy.float32), xp.full((4, 5), 2.0 * rank, numpy.float32))})


def _work(c, xp):
    """Use every resource the communicator creates lazily (shared memory, NCCL, buffers)."""
    mean = (c.size + 1) / 2.0
    host = _model(numpy, c.rank)
    c.allreduce_grad(host)  # host gradients: node-shared memory when ranks share a node
    assert float(host._p['a'].grad[0]) == mean
    m = _model(xp, c.rank)
    c.allreduce_grad(m)
    assert float(m._p['a'].grad[0]) == mean
    c.bcast_data(m)
    assert c.allreduce(xp.ones(3, numpy.float32)).tolist() == [c.size] * 3
    assert c.bcast(xp.arange(4, dtype=numpy.float32) if c.rank == 0 else None).tolist() == [0, 1, 2, 3]


def _calls(c, xp):
    """One call of every communicator method, as (name, thunk)."""
    m = _model(xp, c.rank)
    x = xp.ones(2, numpy.float32)
    return [
        ('allreduce_grad', lambda: c.allreduce_grad(m)),
        ('allreduce_grad', lambda: c.allreduce_grad(m, zero_fill=False)),
        ('allreduce_grad', lambda: c.multi_node_mean_grad(m)),
        ('bcast_data', lambda: c.bcast_data(m)),
        ('allreduce', lambda: c.allreduce(x)),
        ('bcast', lambda: c.bcast(x)),
        ('gather', lambda: c.gather(x)),
        ('allgather', lambda: c.allgather(x)),
        ('scatter', lambda: c.scatter([x] * c.size)),
        ('alltoall', lambda: c.alltoall([x] * c.size)),
        ('send', lambda: c.send(x, dest=0, tag=1)),
        ('recv', lambda: c.recv(0, 1)),
        ('send_obj', lambda: c.send_obj(1, dest=0, tag=1)),
        ('recv_obj', lambda: c.recv_obj(0, 1)),
        ('bcast_obj', lambda: c.bcast_obj(1)),
        ('gather_obj', lambda: c.gather_obj(1)),
        ('allgather_obj', lambda: c.allgather_obj(1)),
        ('allreduce_obj', lambda: c.allreduce_obj(1)),
        ('split', lambda: c.split(0, c.rank)),
    ]


@pytest.mark.parametrize('name', NAMES)
def test_calls_after_finalize_raise_and_finalize_twice_is_safe(name):
    xp = _xp(name)
    c = _new(name)
    _work(c, xp)
    assert c.finalize() is None
    assert c.finalize() is None  # a second call does nothing
    for what, call in _calls(c, xp):
        with pytest.raises(CommunicatorFinalizedError) as info:
            call()
        msg = str(info.value)
        assert '{}()'.format(what) in msg and 'finalize()' in msg, msg
        assert 'rank {}'.format(c.rank) in msg and name in msg, msg
        assert isinstance(info.value, CommunicationError)
    # What describes the process stays readable.
    assert (c.rank, c.size) == (MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size())
    assert 0 <= c.intra_rank < c.intra_size
    # The job's other communicators are untouched.
    other = _new(name)
    _work(other, xp)
    other.finalize()


@pytest.mark.parametrize('name', NAMES)
def test_finalize_releases_shared_memory_window(name):
    xp = _xp(name)
    c = _new(name)
    _work(c, xp)
    reducer = c._reducer
    state = reducer._state
    if c.intra_size > 1:
        assert reducer.uses_shared_memory  # several ranks on the node: the window is in use
    c.finalize()
    assert c._reducer is None and reducer._state is None
    if state:
        assert state.win == MPI.WIN_NULL and state.local == MPI.COMM_NULL


@pytest.mark.parametrize('name', GPU)
def test_finalize_releases_nccl_communicators_and_buffers(name):
    xp = _xp(name)
    c = _new(name)
    _work(c, xp)
    groups = [g for g in (getattr(c, '_nccl', None), getattr(c, '_intra', None)) if g is not None]
    nccl = [g._comm for g in groups]
    subs = [s for s in (getattr(c, '_intra_mpi', None), getattr(c, '_inter', None)) if s is not None]
    if name in ('pure_nccl', 'single_node'):
        assert nccl and all(n is not None for n in nccl)
    if name in ('hierarchical', 'two_dimensional', 'non_cuda_aware'):
        assert len(subs) == 2
    assert c._packer._buffers
    c.finalize()
    assert not c._packer._buffers and not c._packer._plans
    for g in groups:
        assert g._comm is None
        with pytest.raises(CommunicatorFinalizedError, match='finalize'):
            g.get()
    for n in nccl:
        if n is not None:
            assert n._comm is None  # the stand-in's NCCL communicator was destroyed
    for s in subs:
        assert s == MPI.COMM_NULL


@pytest.mark.parametrize('name', NAMES)
def test_finalize_of_a_split_communicator_frees_it_and_keeps_the_parent(name):
    xp = _xp(name)
    c = _new(name)
    sub = c.split(c.rank % 2, c.rank)
    assert sub.allreduce(xp.ones(2, numpy.float32)).tolist() == [sub.size] * 2
    handle = sub.mpi_comm
    sub.finalize()
    assert handle == MPI.COMM_NULL
    with pytest.raises(CommunicatorFinalizedError, match='allreduce'):
        sub.allreduce(xp.ones(2, numpy.float32))
    assert c.allreduce(xp.ones(2, numpy.float32)).tolist() == [c.size] * 2
    c.finalize()
    # A communicator over COMM_WORLD never frees COMM_WORLD.
    assert MPI.COMM_WORLD != MPI.COMM_NULL
    assert MPI.COMM_WORLD.allreduce(1) == MPI.COMM_WORLD.Get_size()


def test_finalize_frees_the_debug_mode_communicator():
    c = create_communicator('naive')
    debug = c._guard.agreement.debug_comm
    if os.environ.get('CHAINERMN_DEBUG'):
        assert debug is not None
    c.finalize()
    if debug is not None:
        assert debug == MPI.COMM_NULL


@pytest.mark.parametrize('name', NAMES)
def test_allreduce_grad_zero_fill_as_the_base_class_declares(name):
    xp = _xp(name)
    c = _new(name)
    mean = (c.size + 1) / 2.0
    for call in (lambda m: c.allreduce_grad(m, False), lambda m: c.allreduce_grad(m, zero_fill=False),
                 lambda m: CommunicatorBase.multi_node_mean_grad(c, m, zero_fill=False)):
        m = _model(xp, c.rank)
        m._p['b'].grad = None  # no gradient on any rank: skipped, stays None
        call(m)
        assert m._p['b'].grad is None
        assert float(m._p['a'].grad[0]) == mean and float(m._p['a'].grad[-1]) == mean
    for call in (lambda m: c.allreduce_grad(m), lambda m: c.allreduce_grad(m, True),
                 lambda m: CommunicatorBase.multi_node_mean_grad(c, m)):
        m = _model(xp, c.rank)
        m._p['b'].grad = None if c.rank == 0 else m._p['b'].grad  # missing on rank 0 only
        call(m)
        g = m._p['b'].grad
        assert g is not None and g.shape == (4, 5)
        # rank r contributes 2 r (rank 0 contributes zeros): mean 2 * (0 + 1 + ... + size-1) / size
        assert float(g[0, 0]) == 2.0 * (c.size - 1) / 2.0
        assert float(m._p['a'].grad[0]) == mean
    c.finalize()
