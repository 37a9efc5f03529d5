"""Per-rank tests of chainermn_links.functions: values and gradients across ranks (run on every rank)."""

import chainer
import chainer.functions as F
import numpy
import pytest

import chainermn_comm
from chainermn_links import functions as mnf
from chainermn_links.testing import check_backward_across_ranks

comm = chainermn_comm.create_communicator('naive')
RANK, SIZE = comm.rank, comm.size
needs2 = pytest.mark.skipif(SIZE < 2, reason='needs at least 2 ranks')


def data(shape, rank=RANK, seed=0, dtype=numpy.float64):
    return numpy.random.RandomState(seed * 100 + rank).uniform(-1, 1, shape).astype(dtype)


# ---------------------------------------------------------------- collectives: values
@pytest.mark.parametrize('dtype', [numpy.float16, numpy.float32, numpy.float64])
def test_bcast_value_and_dtype(dtype):
    root = SIZE - 1
    x = chainer.Variable(data((2, 3), root, dtype=dtype)) if RANK == root else None
    y = mnf.bcast(comm, x, root=root)
    assert y.dtype == dtype and y.shape == (2, 3)
    numpy.testing.assert_array_equal(y.array, data((2, 3), root, dtype=dtype))


def test_gather_scatter_alltoall_allgather_values():
    x = data((3,), seed=1)
    ys = mnf.gather(comm, chainer.Variable(x), root=0)
    if RANK == 0:
        assert len(ys) == SIZE
        for r in range(SIZE):
            numpy.testing.assert_array_equal(ys[r].array, data((3,), r, seed=1))
    else:
        assert ys.shape == ()
    xs = [chainer.Variable(data((r + 1, 2), seed=2)) for r in range(SIZE)] if RANK == 0 else None
    y = mnf.scatter(comm, xs, root=0)
    numpy.testing.assert_array_equal(y.array, data((RANK + 1, 2), 0, seed=2))
    xs = [chainer.Variable(numpy.full((r + 1,), 10.0 * RANK + r)) for r in range(SIZE)]
    ys = mnf.alltoall(comm, xs)
    for r in range(SIZE):
        numpy.testing.assert_array_equal(ys[r].array, numpy.full((RANK + 1,), 10.0 * r + RANK))
    ys = mnf.allgather(comm, chainer.Variable(numpy.full((RANK + 1, 2), float(RANK))))
    for r in range(SIZE):
        numpy.testing.assert_array_equal(ys[r].array, numpy.full((r + 1, 2), float(r)))


# ---------------------------------------------------------------- collectives: gradients
@pytest.mark.parametrize('root', [0, -1])
def test_bcast_grad(root):
    root = root % SIZE
    check_backward_across_ranks(
        comm, lambda *xs: mnf.bcast(comm, xs[0] if xs else None, root=root),
        [data((2, 3), seed=3)] if RANK == root else [])


@pytest.mark.parametrize('root', [0, -1])
def test_gather_grad(root):
    root = root % SIZE
    check_backward_across_ranks(comm, lambda x: mnf.gather(comm, x, root=root), [data((2, 2), seed=4)])


@pytest.mark.parametrize('root', [0, -1])
def test_gather_grad_shape_per_rank(root):
    root = root % SIZE
    check_backward_across_ranks(comm, lambda x: mnf.gather(comm, x, root=root),
                                [data((RANK + 1, RANK + 1), seed=9)])


@pytest.mark.parametrize('dtype', [numpy.float16, numpy.float32, numpy.float64])
@pytest.mark.parametrize('root', [0, -1])
def test_gather_shape_per_rank_values_and_grads(dtype, root):
    # Rank r sends shape (r+1, r+1); the root gets each rank's own shape, and backward
    # returns each rank the gradient of its own piece in its own shape and dtype.
    root = root % SIZE
    x = chainer.Variable(data((RANK + 1, RANK + 1), seed=10, dtype=dtype))
    ys = mnf.gather(comm, x, root=root)
    if RANK == root:
        assert isinstance(ys, tuple) and len(ys) == SIZE
        loss = None
        for r, y in enumerate(ys):
            assert y.shape == (r + 1, r + 1) and y.dtype == dtype
            numpy.testing.assert_array_equal(y.array, data((r + 1, r + 1), r, seed=10, dtype=dtype))
            term = F.sum(y * data((r + 1, r + 1), r, seed=11, dtype=dtype))
            loss = term if loss is None else loss + term
        loss.backward()
    else:
        assert ys.shape == ()
        ys.backward()
    assert x.grad.shape == (RANK + 1, RANK + 1) and x.grad.dtype == dtype
    numpy.testing.assert_array_equal(x.grad, data((RANK + 1, RANK + 1), seed=11, dtype=dtype))


@pytest.mark.parametrize('root', [0, -1])
def test_scatter_grad(root):
    root = root % SIZE
    inputs = [data((r + 1, 2), seed=5) for r in range(SIZE)] if RANK == root else []
    check_backward_across_ranks(comm, lambda *xs: mnf.scatter(comm, xs if xs else None, root=root), inputs)


def test_alltoall_grad():
    inputs = [data((r + 1, RANK + 1), seed=6 + r) for r in range(SIZE)]
    check_backward_across_ranks(comm, lambda *xs: mnf.alltoall(comm, xs), inputs)


def test_allgather_grad():
    check_backward_across_ranks(comm, lambda x: mnf.allgather(comm, x), [data((RANK + 1, 2), seed=7)])


def test_allgather_grad_nonlinear():
    # The loss uses products of slices, so each rank's gradient depends on other ranks' data.
    def f(x):
        ys = mnf.allgather(comm, x)
        z = ys[0]
        for y in ys[1:]:
            z = z * y
        return F.tanh(z) + x
    check_backward_across_ranks(comm, f, [data((2, 3), seed=8)])


@pytest.mark.skipif(SIZE != 1, reason='chainer.gradient_check on one rank only')
def test_chainer_check_backward_single_rank():
    from chainer import gradient_check
    x = data((2, 3), seed=9)
    gy = data((2, 3), seed=10)
    gradient_check.check_backward(lambda v: mnf.bcast(comm, v), x, gy, dtype=numpy.float64)
    gradient_check.check_backward(lambda v: mnf.allgather(comm, v)[0], x, gy, dtype=numpy.float64)
    gradient_check.check_backward(lambda v: mnf.alltoall(comm, (v,))[0], x, gy, dtype=numpy.float64)
    gradient_check.check_backward(lambda v: mnf.scatter(comm, (v,)), x, gy, dtype=numpy.float64)
    gradient_check.check_backward(lambda v: mnf.gather(comm, v)[0], x, gy, dtype=numpy.float64)


# ---------------------------------------------------------------- send / recv
def _pipe(x):
    """Rank 0 -> 1 -> ... -> last rank; each hop applies tanh(2*v); last rank outputs."""
    if RANK == 0:
        return mnf.send(F.tanh(x * 2), comm, 1)
    h = mnf.recv(comm, RANK - 1)
    h = F.tanh(h * 2) + x
    if RANK == SIZE - 1:
        return h
    return mnf.send(h, comm, RANK + 1)


@needs2
def test_send_recv_pipeline_grad():
    check_backward_across_ranks(comm, _pipe, [data((2, 3), seed=11)])


@needs2
def test_send_recv_tuple_grad_and_force_tuple():
    def f(a, b):
        if RANK == 0:
            d = mnf.send((a * 2, F.sin(b)), comm, 1)
            # A single array received with force_tuple=True, on another tag.
            return mnf.send(mnf.pseudo_connect(d, a * b), comm, 1, tag=3)
        if RANK == 1:
            p, q = mnf.recv(comm, 0)
            single = mnf.recv(comm, 0, force_tuple=True, tag=3)
            assert isinstance(single, tuple) and len(single) == 1
            return p * q + single[0] * 3 + a
        return a + b
    check_backward_across_ranks(comm, f, [data((2, 2), seed=12), data((2, 2), seed=13)])


@needs2
def test_send_of_variable_without_grad_roundtrip():
    # Rank 0 sends raw data (no gradient needed) and gets a result back, several times.
    for it in range(3):
        if RANK == 0:
            x = numpy.full((2, 2), float(it))
            d = mnf.send(x, comm, 1)
            y = mnf.recv(comm, 1, delegate_variable=d)
            loss = F.sum(y)
            loss.backward()
            numpy.testing.assert_allclose(y.array, 3 * x + 1)
        elif RANK == 1:
            w = chainer.Variable(numpy.full((2, 2), 3.0))
            h = mnf.recv(comm, 0)
            d = mnf.send(h * w + 1, comm, 0)
            d.backward()
            numpy.testing.assert_allclose(w.grad, numpy.full((2, 2), float(it)))


@needs2
def test_several_sends_in_a_row_any_backward_order():
    # Rank 0 sends three arrays to rank 1 on the same tag, chained with pseudo_connect;
    # rank 1 uses them so that its backward returns the gradients in another order.
    if RANK == 0:
        xs = [chainer.Variable(numpy.full((2,), float(i + 1))) for i in range(3)]
        d = mnf.send(xs[0], comm, 1)
        d = mnf.send(mnf.pseudo_connect(d, xs[1]), comm, 1)
        d = mnf.send(mnf.pseudo_connect(d, xs[2]), comm, 1)
        d.backward()
        for i, x in enumerate(xs):
            numpy.testing.assert_allclose(x.grad, numpy.full((2,), 10.0 ** i))
    elif RANK == 1:
        a = mnf.recv(comm, 0)
        b = mnf.recv(comm, 0)
        c = mnf.recv(comm, 0)
        # c's backward first (deepest), a's last would be the natural order; make a's deeper.
        a2 = a
        for _ in range(5):
            a2 = a2 * 1.0
        loss = F.sum(a2 + 10 * b + 100 * c)
        loss.backward()


@needs2
def test_send_output_unused_with_pseudo_connect():
    # Rank 0: component A receives and makes the model output, component B sends; the model
    # output is pseudo_connect(delegate of B, output of A) (NonConnectedGraph2 in the reference).
    if RANK == 0:
        w = chainer.Variable(numpy.array([2.0, 3.0]))
        h = mnf.recv(comm, 1)
        out = h * w
        d = mnf.send(w * 5, comm, 1)
        y = mnf.pseudo_connect(d, out)
        numpy.testing.assert_allclose(y.array, out.array)
        F.sum(y).backward()
        numpy.testing.assert_allclose(w.grad, h.array + 5 * 7)
    elif RANK == 1:
        v = chainer.Variable(numpy.array([1.0, 4.0]))
        d = mnf.send(v, comm, 0)
        z = mnf.recv(comm, 0, delegate_variable=d)
        F.sum(z * 7).backward()
        numpy.testing.assert_allclose(v.grad, [2.0, 3.0])


def test_pseudo_connect_values_and_grads():
    d = chainer.Variable(numpy.zeros((), numpy.float32))
    a = chainer.Variable(numpy.arange(3.0))
    b = chainer.Variable(numpy.ones((2, 2), numpy.float32))
    ya, yb = mnf.pseudo_connect(d, a, b)
    numpy.testing.assert_array_equal(ya.array, a.array)
    (F.sum(ya * 2) + F.cast(F.sum(yb), numpy.float64)).backward()
    numpy.testing.assert_array_equal(a.grad, numpy.full(3, 2.0))
    numpy.testing.assert_array_equal(b.grad, numpy.ones((2, 2), numpy.float32))
    assert d.grad == 0
    single = mnf.pseudo_connect(d, a)
    assert isinstance(single, chainer.Variable)


def test_pseudo_connect_unpacks_like_v7():
    # Chainer v7 returns a one-element tuple (`loss, = pseudo_connect(d, loss)`), the reference a
    # Variable (`loss = pseudo_connect(d, loss)`): both spellings give the same Variable.
    d = chainer.Variable(numpy.zeros((), numpy.float32))
    for shape in [(), (1, 3), (4,)]:
        x = chainer.Variable(numpy.arange(1, 1 + numpy.prod(shape), dtype=numpy.float64).reshape(shape))
        y = mnf.pseudo_connect(d, x * 2)
        assert isinstance(y, chainer.Variable) and y.shape == shape
        unpacked, = y
        assert unpacked is y
        assert list(y) == [y]
        F.sum(y * 3).backward()
        numpy.testing.assert_array_equal(x.grad, numpy.full(shape, 6.0))
        assert d.grad == 0
        d.cleargrad()


def test_pseudo_connect_with_no_delegate_like_v7():
    # A link whose rank_out is None gives a delegate of None; v7 connects to nothing then.
    x = chainer.Variable(numpy.array([1.0, -2.0]))
    loss, = mnf.pseudo_connect(None, F.sum(x * x))
    assert float(loss.array) == 5.0
    loss.backward()
    numpy.testing.assert_array_equal(x.grad, [2.0, -4.0])
    a, b = mnf.pseudo_connect(None, x, numpy.ones(3, numpy.float32))
    numpy.testing.assert_array_equal(a.array, x.array)
    numpy.testing.assert_array_equal(b.array, numpy.ones(3, numpy.float32))
    with pytest.raises(TypeError, match='needs a delegate variable .* or actual variables; got None'):
        mnf.pseudo_connect(None)


@needs2
def test_recv_of_wrong_kind_raises_communication_error():
    if RANK == 0:
        comm.send(numpy.ones(3), 1, 7)            # plain comm.send, not functions.send
        comm.send_obj({'a': 1}, 1, 8)            # an object
    elif RANK == 1:
        with pytest.raises(chainermn_comm.CommunicationError, match='functions.send did not produce'):
            mnf.recv(comm, 0, tag=7)
        with pytest.raises(chainermn_comm.CommunicationError):
            mnf.recv(comm, 0, tag=8)
    comm.mpi_comm.Barrier()


@needs2
def test_gradient_instead_of_data_raises():
    # Rank 1 back-propagates through a recv, but rank 0 never runs backward of its send and
    # instead waits for new data: it must get a clear error, not wrong tensors.
    if RANK == 0:
        mnf.send(chainer.Variable(numpy.ones(2)), comm, 1, tag=9)
        with pytest.raises(chainermn_comm.CommunicationError, match='gradient'):
            mnf.recv(comm, 1, tag=9)
    elif RANK == 1:
        y = mnf.recv(comm, 0, tag=9)
        F.sum(y).backward()
    comm.mpi_comm.Barrier()


def test_argument_errors():
    with pytest.raises(ValueError, match='itself'):
        mnf.send(chainer.Variable(numpy.ones(1)), comm, RANK)
    with pytest.raises(ValueError, match='out of range'):
        mnf.recv(comm, SIZE)
    with pytest.raises(ValueError, match='alltoall needs'):
        mnf.alltoall(comm, [chainer.Variable(numpy.ones(1))] * (SIZE + 1))
