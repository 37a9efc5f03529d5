"""Per-rank tests of the call guard (run by test_guard_mpi.py with CHAINERMN_DEBUG=1 and n = 1, 2, 3)."""

import chainer
import numpy
import pytest

import chainermn_comm
from chainermn_comm import CommunicationError


@pytest.fixture(scope='module')
def comm():
    return chainermn_comm.create_communicator('naive', timeout=120)


def test_debug_mode_is_on(comm):
    assert comm._guard.debug
    assert comm.timeout == 120.0


def test_matching_calls_pass_the_check(comm):
    """No false alarms: every method with legal, rank-dependent arguments."""
    r, n = comm.rank, comm.size
    x = numpy.full((2, 3), r, numpy.float32)
    assert numpy.array_equal(comm.allreduce(x), numpy.full((2, 3), n * (n - 1) / 2, numpy.float32))
    got = comm.bcast(x if r == 0 else None, root=0)
    assert numpy.array_equal(got, numpy.zeros((2, 3), numpy.float32))
    # allgather allows a different shape on every rank.
    parts = comm.allgather(numpy.arange(r + 1, dtype=numpy.int64))
    assert [p.tolist() for p in parts] == [list(range(i + 1)) for i in range(n)]
    g = comm.gather(numpy.array([r], numpy.int32), root=n - 1)
    assert (g.ravel().tolist() == list(range(n))) if r == n - 1 else g is None
    s = comm.scatter([numpy.array([i * 10]) for i in range(n)] if r == 0 else None)
    assert s.tolist() == [r * 10]
    a = comm.alltoall([numpy.array([r * 100 + j]) for j in range(n)])
    assert [v.tolist() for v in a] == [[j * 100 + r] for j in range(n)]
    assert comm.bcast_obj({'r': r} if r == 0 else None) == {'r': 0}
    assert comm.allreduce_obj(r + 1) == n * (n + 1) // 2
    assert comm.allgather_obj(r) == list(range(n))
    assert comm.gather_obj(r) == (list(range(n)) if r == 0 else None)


def test_allreduce_grad_zero_fill_passes(comm):
    model = chainer.Chain()
    with model.init_scope():
        model.a = chainer.Parameter(numpy.ones(3, numpy.float32))
        model.b = chainer.Parameter(numpy.ones(2, numpy.float32))
    model.a.grad = numpy.full(3, comm.rank, numpy.float32)
    if comm.rank == 0:
        model.b.grad = numpy.full(2, comm.size, numpy.float32)
    comm.allreduce_grad(model, zero_fill=True)
    assert numpy.allclose(model.a.grad, (comm.size - 1) / 2.0)
    assert numpy.allclose(model.b.grad, 1.0)


def test_mismatch_raises_on_every_rank_and_is_recoverable(comm):
    if comm.size == 1:
        pytest.skip('needs two ranks')
    x = numpy.ones(4, numpy.float32)
    with pytest.raises(CommunicationError) as e:
        if comm.rank == 0:
            comm.allreduce(x)
        else:
            comm.bcast_obj('hello')
    msg = str(e.value)
    assert msg.startswith('rank {}: ranks disagree'.format(comm.rank))
    assert 'rank 0: collective call #' in msg and 'allreduce(shape=(4,), dtype=<f4, op=sum)' in msg
    assert 'rank 1: collective call #' in msg and 'bcast_obj(root=0)' in msg
    assert '<- this rank' in msg
    # Neither call ran, so the ranks are still in step and can go on.
    assert comm.allreduce_obj(1) == comm.size


def test_nograd_mismatch_names_the_difference(comm):
    if comm.size == 1:
        pytest.skip('needs two ranks')
    model = chainer.Chain()
    with model.init_scope():
        model.a = chainer.Parameter(numpy.ones(3, numpy.float32))
        model.b = chainer.Parameter(numpy.ones(2, numpy.float32))
    model.a.grad = numpy.ones(3, numpy.float32)
    model.b.grad = numpy.ones(2, numpy.float32) if comm.rank == 0 else None
    with pytest.raises(CommunicationError, match='params has 2 arrays on rank 0 but 1 on rank 1'):
        comm.allreduce_grad(model, zero_fill=False)


def test_point_to_point_is_not_checked(comm):
    if comm.size == 1:
        pytest.skip('needs two ranks')
    before = comm._guard.collective_seq
    if comm.rank == 0:
        comm.send(numpy.arange(3), dest=1, tag=5)
    elif comm.rank == 1:
        assert comm.recv(source=0, tag=5).tolist() == [0, 1, 2]
    assert comm._guard.collective_seq == before
    assert comm._guard.current is None


def test_split_communicator_is_checked(comm):
    sub = comm.split(comm.rank % 2, comm.rank)
    assert sub._guard.debug
    assert sub.allreduce_obj(1) == sub.size
