"""Every CommunicatorBase method of the naive communicator, run on every rank (1, 2, 3, 4 ranks).

All ranks make the same collective calls in the same order.  Run through
tests/test_comm_mpi.py (mpiexec with a hard timeout).
"""

import inspect
import os
import warnings

import chainer
import chainer.links as L
import numpy
import pytest
from mpi4py import MPI

import chainermn_comm
from chainermn_comm import _gpu_support
from _util import NUMERIC, SENDABLE, assert_same, contig, expected_topology, make, reduce_expected

SHAPES = ((2, 3), (), (0, 3), (5,))


@pytest.fixture(scope='module')
def comm():
    return chainermn_comm.create_communicator('naive')


def noncontig(dtype, seed):
    """Return two non-contiguous views (strided and transposed) of deterministic data."""
    base = make(dtype, (4, 6), seed)
    return [base[:, ::2], base.T]


def all_inputs(dtypes, seed):
    """Yield arrays of every dtype and shape (incl. 0-d, empty, non-contiguous) for ``seed``."""
    for dt in dtypes:
        for shape in SHAPES:
            yield make(dt, shape, seed)
        for a in noncontig(dt, seed):
            assert not a.flags.c_contiguous
            yield a


def expect_everywhere(exc, fn, *match):
    """Call ``fn`` and assert it raises ``exc`` with every string of ``match`` in the message."""
    with pytest.raises(exc) as info:
        fn()
    for m in match:
        assert m in str(info.value), str(info.value)
    return info.value


# -- factory ---------------------------------------------------------------
def test_create_communicator_signature():
    sig = inspect.signature(chainermn_comm.create_communicator)
    assert list(sig.parameters) == ['communicator_name', 'mpi_comm', 'allreduce_grad_dtype',
                                    'batched_copy', 'timeout']
    # None is the default (hierarchical with a GPU, else naive): an argparse default works (issue 54).
    assert str(sig) == ("(communicator_name=None, mpi_comm=None, allreduce_grad_dtype=None, "
                        "batched_copy=False, timeout=None)")
    assert sig.parameters['communicator_name'].default is None


def test_communicator_names():
    assert set(chainermn_comm.COMMUNICATOR_NAMES) == {
        'naive', 'flat', 'hierarchical', 'two_dimensional', 'single_node', 'pure_nccl', 'non_cuda_aware'}


def test_unknown_name_lists_valid_names():
    for bad in ('nonexistent', '', 3, 'NAIVE'):   # (None is the default: issue 54)
        err = expect_everywhere(ValueError, lambda: chainermn_comm.create_communicator(bad))
        for name in chainermn_comm.COMMUNICATOR_NAMES:
            assert name in str(err)



def test_misspelt_names_get_a_suggestion():
    # Issue 44: a name that does not exist names the closest one that does (on every rank).
    for bad, good in (('hierachical', 'hierarchical'), ('NAIVE', 'naive'), ('pure-nccl', 'pure_nccl'),
                      ('two_dim', 'two_dimensional')):
        expect_everywhere(ValueError, lambda: chainermn_comm.create_communicator(bad),
                          "unknown communicator name {!r}. Did you mean {!r}?".format(bad, good))
    err = expect_everywhere(ValueError, lambda: chainermn_comm.create_communicator('zzz'))
    assert 'Did you mean' not in str(err)
    for bad, good in (('flaot16', 'float16'), ('bf16', 'bfloat16'), ('atuo', 'auto')):
        expect_everywhere(ValueError, lambda: chainermn_comm.create_communicator(
            'naive', allreduce_grad_dtype=bad), "got {!r}. Did you mean {!r}?".format(bad, good))
    err = expect_everywhere(ValueError, lambda: chainermn_comm.create_communicator(
        'naive', allreduce_grad_dtype=numpy.int32), 'allreduce_grad_dtype')
    assert 'Did you mean' not in str(err)

@pytest.mark.skipif(_gpu_support.gpu_available(), reason='a GPU is available here')
@pytest.mark.parametrize('name', ['flat', 'hierarchical', 'two_dimensional', 'single_node',
                                  'pure_nccl', 'non_cuda_aware'])
def test_gpu_names_unavailable_on_cpu(name):
    err = expect_everywhere(chainermn_comm.CommunicatorUnavailableError,
                            lambda: chainermn_comm.create_communicator(name), name, 'pip install',
                            'cupy', "create_communicator('naive')")
    assert isinstance(err, RuntimeError)


@pytest.mark.skipif(_gpu_support.gpu_available(), reason='a GPU is available here')
def test_default_falls_back_to_naive_quietly():
    for args in ((), (None,)):   # None: an argparse default means the default (issue 54)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter('always')
            c = chainermn_comm.create_communicator(*args)
        assert isinstance(c, chainermn_comm.NaiveCommunicator)
        assert [str(w.message) for w in caught] == []
        assert c.size == MPI.COMM_WORLD.Get_size()


def test_naive_by_name_does_not_warn():
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        c = chainermn_comm.create_communicator('naive', mpi_comm=MPI.COMM_WORLD, timeout=0)
    assert c.timeout == 0
    assert c.mpi_comm is MPI.COMM_WORLD


def test_invalid_grad_dtype():
    for bad in (numpy.int32, 'int8', numpy.complex64, numpy.longdouble, 'bogus'):
        expect_everywhere(ValueError, lambda: chainermn_comm.create_communicator(
            'naive', allreduce_grad_dtype=bad), 'allreduce_grad_dtype')


def test_non_comm_rejected():
    expect_everywhere(TypeError, lambda: chainermn_comm.create_communicator('naive', mpi_comm=object()),
                      'mpi_comm')


# -- properties --------------------------------------------------------------
def test_properties(comm):
    world = MPI.COMM_WORLD
    assert isinstance(comm, chainermn_comm.CommunicatorBase)
    assert comm.rank == world.Get_rank()
    assert comm.size == world.Get_size()
    assert comm.mpi_comm is world
    want = expected_topology(comm.rank, comm.size)
    assert (comm.intra_rank, comm.intra_size, comm.inter_rank, comm.inter_size) == want
    # The topology agrees across ranks.
    everyone = comm.allgather_obj((comm.rank, comm.intra_rank, comm.intra_size,
                                   comm.inter_rank, comm.inter_size))
    assert [e[0] for e in everyone] == list(range(comm.size))
    assert len({e[4] for e in everyone}) == 1
    assert sum(1 for e in everyone if e[3] == comm.inter_rank) == comm.intra_size
    assert repr(comm).startswith('<NaiveCommunicator rank={} size={}'.format(comm.rank, comm.size))


# -- point to point ----------------------------------------------------------
def ring(comm, send, recv):
    """Send to the next rank and receive from the previous one without deadlock."""
    nxt, prev = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
    if comm.rank % 2 == 0:
        send(nxt)
        return recv(prev)
    got = recv(prev)
    send(nxt)
    return got


def need_peers(comm):
    if comm.size < 2:
        pytest.skip('point-to-point needs 2 ranks')


def test_send_recv_arrays(comm):
    need_peers(comm)
    prev = (comm.rank - 1) % comm.size
    mine = list(all_inputs(SENDABLE, comm.rank))
    theirs = [contig(a) for a in all_inputs(SENDABLE, prev)]

    def send(dest):
        for i, a in enumerate(mine):
            comm.send(a, dest, 10 + i % 3)

    def recv(src):
        return [comm.recv(src, 10 + i % 3) for i in range(len(mine))]

    got = ring(comm, send, recv)
    assert len(got) == len(theirs)
    for g, w in zip(got, theirs):
        assert g.flags.c_contiguous
        assert_same(g, w)


def test_send_recv_tuples_and_scalars(comm):
    need_peers(comm)
    prev = (comm.rank - 1) % comm.size

    def payload(seed):
        return (make('float32', (2, 2), seed), make('int64', (), seed), make('float16', (0,), seed),
                noncontig('uint8', seed)[1])

    def send(dest):
        comm.send(payload(comm.rank), dest, 1)
        comm.send(list(payload(comm.rank)), dest, 2)
        comm.send((), dest, 3)
        comm.send(numpy.float32(comm.rank + 0.5), dest, 4)
        comm.send(comm.rank + 7, dest, 5)

    def recv(src):
        return [comm.recv(src, t) for t in (1, 2, 3, 4, 5)]

    tup, lst, empty, scalar, pyint = ring(comm, send, recv)
    want = payload(prev)
    for got in (tup, lst):
        assert isinstance(got, tuple) and len(got) == len(want)
        for g, w in zip(got, want):
            assert_same(g, contig(w))
    assert empty == ()
    assert_same(scalar, numpy.array(prev + 0.5, dtype=numpy.float32))
    assert scalar.shape == () and int(pyint) == prev + 7


def test_send_obj_recv_obj(comm):
    need_peers(comm)
    prev = (comm.rank - 1) % comm.size

    def obj(seed):
        return {'rank': seed, 'list': list(range(seed + 3)), 'arr': make('float64', (3,), seed),
                'none': None, 'text': 'r{}'.format(seed) * 100}

    got = ring(comm, lambda d: comm.send_obj(obj(comm.rank), d, 7),
               lambda s: comm.recv_obj(s, 7))
    want = obj(prev)
    assert got['rank'] == prev and got['list'] == want['list'] and got['none'] is None
    assert got['text'] == want['text']
    assert_same(got['arr'], want['arr'])
    got = ring(comm, lambda d: comm.send_obj(None, d, 0), lambda s: comm.recv_obj(s, 0))
    assert got is None


def test_recv_of_other_kind_raises_and_stays_in_step(comm):
    need_peers(comm)
    prev = (comm.rank - 1) % comm.size
    big = 300000  # larger than MPICH's eager limit: the sender blocks unless the receiver drains

    def send(dest):
        comm.send_obj({'x': comm.rank}, dest, 3)
        comm.send(make('float64', (big,), comm.rank), dest, 3)
        comm.send(make('int32', (4,), comm.rank), dest, 3)
        comm.send_obj('after', dest, 3)

    def recv(src):
        e1 = expect_everywhere(chainermn_comm.CommunicationError, lambda: comm.recv(src, 3),
                               'recv_obj', 'rank {}'.format(comm.rank))
        e2 = expect_everywhere(chainermn_comm.CommunicationError, lambda: comm.recv_obj(src, 3),
                               'recv', 'rank {}'.format(comm.rank))
        return e1, e2, comm.recv(src, 3), comm.recv_obj(src, 3)

    _, _, arr, text = ring(comm, send, recv)
    assert_same(arr, make('int32', (4,), prev))
    assert text == 'after'


def test_send_recv_argument_errors(comm):
    need_peers(comm)
    a = numpy.zeros(3)
    expect_everywhere(ValueError, lambda: comm.send(a, comm.size, 0), 'dest', str(comm.size))
    expect_everywhere(ValueError, lambda: comm.send(a, -1, 0), 'dest')
    expect_everywhere(TypeError, lambda: comm.send(a, 'one', 0), 'dest')
    expect_everywhere(ValueError, lambda: comm.send(a, 0, -5), 'tag')
    expect_everywhere(ValueError, lambda: comm.recv(comm.size + 3, 0), 'source')
    expect_everywhere(ValueError, lambda: comm.send_obj(1, comm.size, 0), 'dest')
    expect_everywhere(ValueError, lambda: comm.recv_obj(-2, 0), 'source')
    expect_everywhere(TypeError, lambda: comm.send(object(), 0, 0), 'send', 'object')
    expect_everywhere(TypeError, lambda: comm.send((a, 'x'), 0, 0), 'send', 'str')
    expect_everywhere(TypeError, lambda: comm.send(numpy.array([None, 1]), 0, 0), 'object', 'send_obj')


# -- broadcast ---------------------------------------------------------------
def test_bcast_every_root(comm):
    for root in range(comm.size):
        for a in all_inputs(SENDABLE, root):
            data = a if comm.rank == root else None
            got = comm.bcast(data, root=root)
            assert_same(got, contig(a))


def test_bcast_ignores_non_root_data(comm):
    root = comm.size - 1
    data = make('int32', (3, 4), 9) if comm.rank == root else 'ignored'
    assert_same(comm.bcast(data, root=root), make('int32', (3, 4), 9))


def test_bcast_max_buf_len_pieces(comm):
    want = make('float64', (1001,), 4)
    for max_buf_len in (7, 1000, 8008, 1 << 20):
        for root in {0, comm.size - 1}:
            data = want if comm.rank == root else None
            assert_same(comm.bcast(data, max_buf_len=max_buf_len, root=root), want)
    expect_everywhere(ValueError, lambda: comm.bcast(want, max_buf_len=0), 'max_buf_len')


def test_bcast_errors_on_every_rank(comm):
    a = numpy.arange(3)
    expect_everywhere(ValueError, lambda: comm.bcast(a, root=comm.size), 'root')
    expect_everywhere(ValueError, lambda: comm.bcast(a, root=-1), 'root')
    expect_everywhere(TypeError, lambda: comm.bcast(a, root=0.5), 'root')
    root = comm.size - 1
    for bad in ([1, 2, 3], 'text', {'a': 1}, numpy.array([object()])):
        data = bad if comm.rank == root else a
        expect_everywhere(ValueError, lambda: comm.bcast(data, root=root),
                          'bcast', 'rank {}'.format(root))
    # Still in step afterwards.
    assert_same(comm.bcast(a if comm.rank == root else None, root=root), a)


def test_bcast_obj(comm):
    for root in range(comm.size):
        obj = {'root': root, 'payload': list(range(50))} if comm.rank == root else None
        got = comm.bcast_obj(obj, root=root)
        assert got == {'root': root, 'payload': list(range(50))}
        got = comm.bcast_obj(('x' * 5000, root) if comm.rank == root else None, max_buf_len=100,
                             root=root)
        assert got == ('x' * 5000, root)
    expect_everywhere(ValueError, lambda: comm.bcast_obj(1, root=comm.size), 'root')


# -- gather / allgather / scatter / alltoall ------------------------------------
def test_gather_every_root(comm):
    for root in range(comm.size):
        for i, a in enumerate(all_inputs(NUMERIC + ('bool',), comm.rank)):
            got = comm.gather(a, root=root)
            if comm.rank != root:
                assert got is None
                continue
            want = numpy.stack([contig(list(all_inputs(NUMERIC + ('bool',), r))[i])
                                for r in range(comm.size)])
            assert_same(got, want)


def test_gather_errors_on_every_rank(comm):
    expect_everywhere(ValueError, lambda: comm.gather(numpy.zeros(2), root=comm.size), 'root')
    bad = 'not an array' if comm.rank == comm.size - 1 else numpy.zeros(2)
    expect_everywhere(ValueError, lambda: comm.gather(bad), 'gather', 'rank {}'.format(comm.size - 1))
    if comm.size > 1:
        shaped = numpy.zeros((comm.rank + 1,))
        expect_everywhere(ValueError, lambda: comm.gather(shaped), 'same shape', 'rank 1: (2,)')
        typed = numpy.zeros(2, dtype='float32' if comm.rank == 0 else 'float64')
        expect_everywhere(ValueError, lambda: comm.gather(typed), 'dtype')
    got = comm.gather(numpy.int64(comm.rank), root=0)  # still in step
    if comm.rank == 0:
        assert_same(got, numpy.arange(comm.size))


def test_gather_obj(comm):
    for root in range(comm.size):
        got = comm.gather_obj({'r': comm.rank, 's': 'x' * comm.rank}, root=root)
        if comm.rank == root:
            assert got == [{'r': r, 's': 'x' * r} for r in range(comm.size)]
        else:
            assert got is None
    expect_everywhere(ValueError, lambda: comm.gather_obj(1, root=-1), 'root')


def test_allgather(comm):
    for dt in NUMERIC + ('bool',):
        mine = make(dt, (comm.rank + 1, 2), comm.rank)[:, ::-1]  # shapes differ, non-contiguous
        got = comm.allgather(mine)
        assert isinstance(got, tuple) and len(got) == comm.size
        for r, g in enumerate(got):
            assert_same(g, contig(make(dt, (r + 1, 2), r)[:, ::-1]))
    got = comm.allgather(numpy.float32(comm.rank))
    assert [float(g) for g in got] == list(range(comm.size)) and got[0].shape == ()
    got = comm.allgather(numpy.zeros((0, 4)))
    assert all(g.shape == (0, 4) for g in got)
    bad = [1.0] if comm.rank == 0 else numpy.zeros(1)
    expect_everywhere(ValueError, lambda: comm.allgather(bad), 'allgather', 'rank 0')


def test_allgather_obj(comm):
    assert comm.allgather_obj(('r', comm.rank)) == [('r', r) for r in range(comm.size)]


def test_scatter_every_root(comm):
    for root in range(comm.size):
        for dt in NUMERIC:
            items = [make(dt, (r + 1, 3), root * 10 + r)[:, ::2] for r in range(comm.size)]
            got = comm.scatter(tuple(items) if comm.rank == root else None, root=root)
            assert_same(got, contig(items[comm.rank]))
        # An array whose first axis has one row per rank, and a list.
        rows = make('int16', (comm.size, 2, 2), root)
        assert_same(comm.scatter(rows if comm.rank == root else None, root=root), rows[comm.rank])
        items = [numpy.float64(r * 1.5) for r in range(comm.size)]
        got = comm.scatter(items if comm.rank == root else None, root=root)
        assert got.shape == () and float(got) == comm.rank * 1.5


def test_scatter_errors_on_every_rank(comm):
    root = comm.size - 1
    good = [numpy.zeros(1)] * comm.size
    expect_everywhere(ValueError, lambda: comm.scatter(good, root=comm.size), 'root')
    for bad in ([numpy.zeros(1)] * (comm.size + 1), 'abc', 5, numpy.float32(1), numpy.zeros(comm.size + 1),
                [numpy.zeros(1)] * (comm.size - 1) + ['x']):
        data = bad if comm.rank == root else good
        expect_everywhere(ValueError, lambda: comm.scatter(data, root=root), 'scatter',
                          'rank {}'.format(root))
    got = comm.scatter([numpy.full(2, r) for r in range(comm.size)] if comm.rank == root else None,
                       root=root)
    assert_same(got, numpy.full(2, comm.rank))


def test_alltoall(comm):
    for dt in NUMERIC + ('bool',):
        xs = tuple(make(dt, (comm.rank + 1, j + 1), comm.rank * 10 + j) for j in range(comm.size))
        got = comm.alltoall(xs)
        assert isinstance(got, tuple) and len(got) == comm.size
        for i, g in enumerate(got):
            assert_same(g, make(dt, (i + 1, comm.rank + 1), i * 10 + comm.rank))
    got = comm.alltoall([numpy.int32(comm.rank * 100 + j) for j in range(comm.size)])
    assert [int(g) for g in got] == [i * 100 + comm.rank for i in range(comm.size)]


def test_alltoall_errors_on_every_rank(comm):
    good = [numpy.zeros(1)] * comm.size
    bad_rank = comm.size - 1
    for bad in ([numpy.zeros(1)] * (comm.size + 1), numpy.zeros(comm.size), ['x'] * comm.size):
        data = bad if comm.rank == bad_rank else good
        expect_everywhere(ValueError, lambda: comm.alltoall(data), 'alltoall', 'rank {}'.format(bad_rank))
    got = comm.alltoall([numpy.full(1, comm.rank)] * comm.size)
    assert [int(g[0]) for g in got] == list(range(comm.size))


# -- reductions ------------------------------------------------------------------
def reduction_input(dt, shape, rank, op):
    if op == 'prod':  # keep products small enough for int8
        base = make('int64', shape, 0) % 2 + 1 + rank % 2
        return base.astype(dt)
    return make(dt, shape, rank)


@pytest.mark.parametrize('op', ['sum', 'max', 'min', 'prod'])
def test_allreduce_every_dtype(comm, op):
    for dt in NUMERIC:
        if numpy.dtype(dt).kind == 'c' and op in ('max', 'min'):
            expect_everywhere(TypeError, lambda: comm.allreduce(make(dt, (2,), 0), op=op), 'complex', op)
            continue
        for shape in SHAPES:
            mine = reduction_input(dt, shape, comm.rank, op)
            want = reduce_expected([reduction_input(dt, shape, r, op) for r in range(comm.size)], op)
            before = mine.copy()
            got = comm.allreduce(mine, op=op)
            assert_same(got, want)
            numpy.testing.assert_array_equal(mine, before)  # input untouched
            got = comm.allreduce(numpy.asfortranarray(mine.reshape(shape + (1,)))[..., 0].T
                                 if len(shape) == 2 else mine, op=op)
            assert_same(got, want.T if len(shape) == 2 else want)


def test_allreduce_default_and_variants(comm):
    x = numpy.arange(6, dtype=numpy.float32).reshape(2, 3)[:, ::2] * (comm.rank + 1)
    total = sum(r + 1 for r in range(comm.size))
    assert_same(comm.allreduce(x), numpy.arange(6, dtype=numpy.float32).reshape(2, 3)[:, ::2] * total)
    assert_same(comm.allreduce(x, op='SUM'), comm.allreduce(x, op='sum'))
    assert_same(comm.allreduce(x, op=MPI.MAX), numpy.arange(6, dtype=numpy.float32).reshape(2, 3)[:, ::2]
                * comm.size)
    got = comm.allreduce(numpy.float16(0.5))
    assert got.dtype == numpy.float16 and got.shape == () and float(got) == 0.5 * comm.size
    assert float(comm.allreduce(2.5)) == 2.5 * comm.size


def test_allreduce_errors(comm):
    expect_everywhere(TypeError, lambda: comm.allreduce(numpy.array([True, False])), 'bool', 'numeric')
    expect_everywhere(TypeError, lambda: comm.allreduce(numpy.array(['a'])), 'numeric')
    expect_everywhere(TypeError, lambda: comm.allreduce(numpy.array([None])), 'object')
    expect_everywhere(TypeError, lambda: comm.allreduce([1, 2]), 'allreduce', 'list')
    expect_everywhere(ValueError, lambda: comm.allreduce(numpy.zeros(2), op='mean'), 'mean', 'sum')
    assert_same(comm.allreduce(numpy.ones(2, numpy.int32)), numpy.full(2, comm.size, numpy.int32))


def test_allreduce_obj(comm):
    assert comm.allreduce_obj(comm.rank + 1) == sum(range(1, comm.size + 1))
    assert comm.allreduce_obj(float(comm.rank) + 0.25) == pytest.approx(
        sum(r + 0.25 for r in range(comm.size)))
    assert comm.allreduce_obj([comm.rank]) == list(range(comm.size))
    assert comm.allreduce_obj(comm.rank * 3, op='max') == (comm.size - 1) * 3
    assert comm.allreduce_obj(comm.rank - 5, op='min') == -5
    assert comm.allreduce_obj(comm.rank + 1, op='prod') == numpy.prod(range(1, comm.size + 1))
    got = comm.allreduce_obj(numpy.full(3, comm.rank, dtype=numpy.int64))
    assert_same(got, numpy.full(3, sum(range(comm.size)), dtype=numpy.int64))
    expect_everywhere(ValueError, lambda: comm.allreduce_obj(1, op='mean'), 'mean')


# -- model helpers ---------------------------------------------------------------
class Model(chainer.Chain):
    def __init__(self, seed):
        super().__init__()
        rng = numpy.random.RandomState(seed)
        with self.init_scope():
            self.l1 = L.Linear(3, 4, initialW=rng.randn(4, 3).astype(numpy.float32))
            self.l2 = L.Linear(4, 2, initialW=rng.randn(2, 4).astype(numpy.float32))
            self.w64 = chainer.Parameter(rng.randn(5, 7).astype(numpy.float64))
            self.w16 = chainer.Parameter(rng.randn(3).astype(numpy.float16))
            self.lazy = L.Linear(None, 2)  # uninitialised parameters are skipped


def test_bcast_data(comm):
    model = Model(seed=100 + comm.rank)
    model.w64.array = model.w64.array.T  # non-contiguous parameter array
    reference = {n: p.array.copy() for n, p in Model(seed=100).namedparams() if p.array is not None}
    reference['/w64'] = reference['/w64'].T
    comm.bcast_data(model)
    for name, p in model.namedparams():
        if p.array is None:
            assert name.startswith('/lazy')
            continue
        assert_same(p.array, reference[name])


def set_grads(model, rank):
    names = []
    for i, (name, p) in enumerate(sorted(model.namedparams())):
        if p.array is None:
            continue
        p.grad = numpy.full(p.array.shape, (rank + 1) * (i + 1), dtype=p.array.dtype)
        names.append((name, i))
    return names


@pytest.mark.parametrize('method', ['allreduce_grad', 'multi_node_mean_grad'])
def test_mean_grad_averages(comm, method):
    model = Model(seed=1)
    names = set_grads(model, comm.rank)
    getattr(comm, method)(model)
    mean_scale = sum(r + 1 for r in range(comm.size)) / comm.size
    params = dict(model.namedparams())
    for name, i in names:
        p = params[name]
        assert_same(p.grad, numpy.full(p.array.shape, mean_scale * (i + 1), dtype=p.array.dtype))


def test_mean_grad_zero_fill_one_rank_without_grad(comm):
    model = Model(seed=1)
    names = dict(set_grads(model, comm.rank))
    if comm.rank == 0:
        model.l2.b.grad = None
    comm.multi_node_mean_grad(model)  # zero_fill=True is the default
    i = names['/l2/b']
    want = sum((r + 1) * (i + 1) for r in range(1, comm.size)) / comm.size
    assert_same(model.l2.b.grad, numpy.full(2, want, dtype=numpy.float32))
    i = names['/l1/W']
    want = sum((r + 1) * (i + 1) for r in range(comm.size)) / comm.size
    assert_same(model.l1.W.grad, numpy.full((4, 3), want, dtype=numpy.float32))
    # zero_fill=False on every rank: parameters without gradients are left alone.
    model.l2.b.grad = None
    model.l2.W.grad = None
    comm.allreduce_grad(model, zero_fill=False)
    assert model.l2.b.grad is None and model.l2.W.grad is None


def test_mean_grad_takes_a_shared_parameter_once(comm):
    """A link registered under two names is averaged once: twice would divide its sum twice."""
    big = L.Linear(256, 300)    # W: 300 KiB of float32, all-reduced in place
    small = L.Linear(3, 2)      # packed with others
    model = chainer.Chain()
    with model.init_scope():
        model.a, model.b, model.c, model.d = big, big, small, small
    params = [big.W, big.b, small.W, small.b]
    for i, p in enumerate(params):
        p.grad = numpy.full(p.array.shape, (comm.rank + 1) * (i + 1), dtype=p.array.dtype)
    comm.multi_node_mean_grad(model)
    mean = sum(r + 1 for r in range(comm.size)) / comm.size
    for i, p in enumerate(params):
        assert_same(p.grad, numpy.full(p.array.shape, mean * (i + 1), dtype=p.array.dtype))


@pytest.mark.parametrize('grad_dtype', [numpy.float16, numpy.float64, 'float32'])
def test_allreduce_grad_dtype(comm, grad_dtype):
    c = chainermn_comm.create_communicator('naive', allreduce_grad_dtype=grad_dtype)
    assert c.allreduce_grad_dtype == numpy.dtype(grad_dtype)
    model = Model(seed=1)
    rng = numpy.random.RandomState(comm.rank)
    grads = {}
    for name, p in model.namedparams():
        if p.array is not None:
            p.grad = rng.uniform(-2, 2, p.array.shape).astype(p.array.dtype)
            grads[name] = p.grad.copy()
    everyone = comm.allgather_obj(grads)
    c.allreduce_grad(model)
    for name, p in model.namedparams():
        if p.array is None:
            continue
        rtol = 2e-2 if numpy.float16 in (numpy.dtype(grad_dtype), p.array.dtype) else 1e-5
        want = sum(g[name].astype(numpy.float64) for g in everyone) / comm.size
        assert p.grad.dtype == p.array.dtype  # communication dtype does not change the grad dtype
        numpy.testing.assert_allclose(p.grad.astype(numpy.float64), want, rtol=rtol, atol=rtol)


def test_allreduce_grad_small_chunks(comm):
    """Parameters spanning several chunks of a tiny chunk buffer average correctly."""
    old = os.environ.get('CHAINERMN_CHUNK_BYTES')
    os.environ['CHAINERMN_CHUNK_BYTES'] = '64'
    try:
        c = chainermn_comm.create_communicator('naive')
    finally:
        if old is None:
            del os.environ['CHAINERMN_CHUNK_BYTES']
        else:
            os.environ['CHAINERMN_CHUNK_BYTES'] = old
    model = Model(seed=1)
    names = set_grads(model, comm.rank)
    c.allreduce_grad(model)
    mean_scale = sum(r + 1 for r in range(comm.size)) / comm.size
    params = dict(model.namedparams())
    for name, i in names:
        assert_same(params[name].grad,
                    numpy.full(params[name].array.shape, mean_scale * (i + 1), params[name].array.dtype))
    c.bcast_data(model)


# -- split -------------------------------------------------------------------------
def test_split(comm):
    color = comm.rank % 2
    sub = comm.split(color, -comm.rank)  # reversed order inside each colour
    members = [r for r in range(comm.size) if r % 2 == color]
    assert isinstance(sub, chainermn_comm.NaiveCommunicator)
    assert sub.size == len(members)
    assert sub.rank == sorted(members, reverse=True).index(comm.rank)
    assert sub.intra_size * sub.inter_size >= sub.size
    assert int(sub.allreduce(numpy.int64(comm.rank))) == sum(members)
    assert sub.allgather_obj(comm.rank) == sorted(members, reverse=True)
    sub.mpi_comm.Free()
    # MPI.UNDEFINED leaves a rank out: it gets None.
    sub = comm.split(MPI.UNDEFINED if comm.rank == 0 else 1, comm.rank)
    if comm.rank == 0:
        assert sub is None
    else:
        assert sub.size == comm.size - 1 and sub.rank == comm.rank - 1
        sub.mpi_comm.Free()
