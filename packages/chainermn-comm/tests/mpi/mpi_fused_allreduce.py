"""Per-rank tests of small all-reduces fused with the default-mode check (run by test_guard_mpi.py)."""

import functools

import numpy
import pytest

import chainermn_comm
from chainermn_comm import CommunicationError
from chainermn_comm.reduce import wire as _wire

FNS = {'sum': numpy.add, 'prod': numpy.multiply, 'max': numpy.maximum, 'min': numpy.minimum}


@pytest.fixture(scope='module')
def comm():
    return chainermn_comm.create_communicator('naive', timeout=120)


@pytest.fixture
def spy(monkeypatch):
    calls = []
    real = _wire.reduce_rows

    def record(rows, out, name):
        calls.append((len(rows), out.shape, out.dtype, name))
        return real(rows, out, name)

    monkeypatch.setattr(_wire, 'reduce_rows', record)
    return calls


def _mine(rank, dtype, shape):
    n = int(numpy.prod(shape, dtype=numpy.int64))
    a = (numpy.arange(n) % 5 + rank + 1).astype(dtype).reshape(shape)
    return numpy.asarray(a / 3 if a.dtype.kind in 'fc' else a, dtype=dtype)


@pytest.mark.parametrize('dtype', ['int32', 'uint8', 'float16', 'float32', 'float64', 'complex64'])
@pytest.mark.parametrize('op', ['sum', 'prod', 'max', 'min'])
@pytest.mark.parametrize('shape', [(), (1,), (2, 3)])
def test_small_allreduce_rides_in_the_check(comm, spy, dtype, op, shape):
    if op in ('max', 'min') and dtype.startswith('complex'):
        pytest.skip('no max/min of complex numbers')
    got = comm.allreduce(_mine(comm.rank, dtype, shape), op=op)
    want = functools.reduce(lambda a, b: numpy.asarray(FNS[op](a, b), dtype=a.dtype),
                            [_mine(r, dtype, shape) for r in range(comm.size)])
    assert got.shape == want.shape and got.dtype == want.dtype
    # Fused: integers at any size, floats with two ranks (their sum does not depend on the order).
    fused = comm.size > 1 and (comm.size == 2 or numpy.dtype(dtype).kind in 'iu')
    if fused or numpy.dtype(dtype).kind in 'iu' or comm.size == 1:
        assert numpy.array_equal(got, want)  # bit for bit
    else:  # MPI's own order of additions
        tol = 2e-3 if dtype == 'float16' else 1e-6
        numpy.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    assert spy == ([(comm.size, shape, numpy.dtype(dtype), op)] if fused else [])


def test_larger_arrays_take_mpi(comm, spy):
    got = comm.allreduce(numpy.full(9, comm.rank + 1.0))  # 72 bytes: more than the record carries
    assert numpy.array_equal(got, numpy.full(9, comm.size * (comm.size + 1) / 2))
    assert spy == []
    got = comm.allreduce(numpy.full(8, comm.rank + 1))  # 64 bytes of int64: fused
    assert numpy.array_equal(got, numpy.full(8, comm.size * (comm.size + 1) // 2))
    assert len(spy) == (1 if comm.size > 1 else 0)


def test_unchecked_calls_take_mpi(comm, spy):
    guard = comm._guard
    was, guard.check = guard.check, False
    try:
        got = comm.allreduce(numpy.float32([comm.rank]))
    finally:
        guard.check = was
    assert got.tolist() == [comm.size * (comm.size - 1) / 2]
    assert spy == []


def test_disagreeing_small_allreduce_raises_on_every_rank(comm):
    if comm.size == 1:
        pytest.skip('one rank cannot disagree')
    x = numpy.ones(1 if comm.rank == 0 else 2, numpy.float32)
    with pytest.raises(CommunicationError, match=r'First difference: shape is \(1,\) on rank 0 but \(2,\)'):
        comm.allreduce(x)
    # The ranks stay in step: the next call works.
    assert comm.allreduce(numpy.float32([1]))[0] == comm.size
