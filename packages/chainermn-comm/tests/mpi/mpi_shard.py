"""Per-rank tests of the reduce-scatter / all-gather of owned arrays (run by test_shard_collectives.py).

$CHAINERMN_TEST_SHARD_COMMS lists the communicators (host ones; GPU ones run on the stand-in).
"""

import os

import numpy
import pytest

from chainermn_comm import create_communicator
from chainermn_comm.reduce import codecs, shard

NAMES = [n for n in os.environ.get('CHAINERMN_TEST_SHARD_COMMS', 'naive').split(',') if n]
GPU = os.environ.get('CHAINERMN_TEST_SHARD_GPU') == '1'
#: Several nodes of several ranks through node-shared memory: a node's sum goes to the owner's local
#: rank there (``reduce.shard``, ``_mean_nodes``), so that rank's copy is not left as it was.
NODES = os.environ.get('CHAINERMN_TEST_SHARD_NODES') == '1'
_comms = {}


def get(name):
    if name not in _comms:
        if GPU:
            import cupy
            from mpi4py import MPI
            cupy.cuda.Device(0 if cupy.cuda.runtime.getDeviceCount() == 1
                             else MPI.COMM_WORLD.Get_rank()).use()
        _comms[name] = create_communicator(name)
    return _comms[name]


def _xp():
    if GPU:
        import cupy
        return cupy
    return numpy


def _to_host(a):
    return a.get() if hasattr(a, 'get') and not isinstance(a, numpy.ndarray) else a


SHAPES = [((3, 4), numpy.float32), ((17,), numpy.float64), ((0,), numpy.float32), ((), numpy.float32),
          ((2, 3, 5), numpy.float16), ((30000,), numpy.float32), ((7,), numpy.float32),
          ((5, 5), numpy.float64)]


def _terms(size, seed=0):
    """Return every rank's arrays (the same on every rank: a rank's term depends on its rank only)."""
    out = []
    for r in range(size):
        rng = numpy.random.RandomState(seed + 17 * r)
        out.append([rng.standard_normal(s).astype(d) if s != () else numpy.asarray(rng.standard_normal(), d)
                    for s, d in SHAPES])
    return out


def _owners(n, size, kind):
    if kind == 'round':
        return [i % size for i in range(n)]
    if kind == 'one':  # every array on the last rank: the others own nothing (unequal shares)
        return [size - 1] * n
    return [0 if i == 5 else (i % size) for i in range(n)]


def _expected_mean(terms, i):
    dt = terms[0][i].dtype
    wide = numpy.float32 if dt == numpy.float16 else dt.type
    acc = terms[0][i].astype(wide)
    for t in terms[1:]:
        acc = acc + t[i].astype(wide)
    return (acc * wide(1.0 / len(terms))).astype(dt)


@pytest.mark.parametrize('name', NAMES)
@pytest.mark.parametrize('kind', ['round', 'one', 'big0'])
@pytest.mark.parametrize('chunk', [None, 4096])
def test_mean_to_owners_exact(name, kind, chunk):
    comm = get(name)
    xp = _xp()
    sc = comm.averaging.shard_collectives()
    if chunk is not None:
        sc = sc.with_chunk(chunk)
    terms = _terms(comm.size)
    arrays = [xp.asarray(a.copy()) for a in terms[comm.rank]]
    owners = _owners(len(arrays), comm.size, kind)
    sc.mean_to_owners(arrays, owners)
    for i, (a, r) in enumerate(zip(arrays, owners)):
        got = _to_host(a)
        assert got.dtype == terms[0][i].dtype and got.shape == terms[0][i].shape
        if r == comm.rank:
            tol = 2e-3 if got.dtype == numpy.float16 else 1e-6
            numpy.testing.assert_allclose(got, _expected_mean(terms, i), rtol=tol, atol=tol)
        elif not NODES or got.dtype.itemsize < 4:
            assert numpy.array_equal(got, terms[comm.rank][i])  # left as it was


@pytest.mark.parametrize('name', NAMES)
@pytest.mark.parametrize('wire', [numpy.float16, 'bfloat16', 'auto'])
def test_mean_to_owners_wires(name, wire):
    comm = get(name)
    xp = _xp()
    sc = comm.averaging.shard_collectives()
    terms = _terms(comm.size, seed=5)
    owners = _owners(len(SHAPES), comm.size, 'round')
    for _ in range(7 if wire == 'auto' else 1):  # 'auto' times 6 calls, then agrees
        arrays = [xp.asarray(a.copy()) for a in terms[comm.rank]]
        sc.mean_to_owners(arrays, owners, wire=wire)
        for i, (a, r) in enumerate(zip(arrays, owners)):
            if r == comm.rank:
                tol = 2e-2 if wire != 'auto' or comm.size > 1 else 1e-6
                numpy.testing.assert_allclose(_to_host(a), _expected_mean(terms, i), rtol=tol, atol=tol)
    if wire == 'auto' and comm.size > 1:
        choice = sc.wire_chosen(arrays)
        assert choice is not False
        assert comm.allgather_obj(str(choice)) == [str(choice)] * comm.size


@pytest.mark.parametrize('name', NAMES)
@pytest.mark.parametrize('kind', ['round', 'one', 'big0'])
def test_gather_from_owners_bitwise(name, kind):
    comm = get(name)
    xp = _xp()
    sc = comm.averaging.shard_collectives()
    terms = _terms(comm.size, seed=9)
    owners = _owners(len(SHAPES), comm.size, kind)
    arrays = [xp.asarray(a.copy()) for a in terms[comm.rank]]
    sc.gather_from_owners(arrays, owners)
    for i, (a, r) in enumerate(zip(arrays, owners)):
        assert _to_host(a).tobytes() == terms[r][i].tobytes()


@pytest.mark.parametrize('name', NAMES)
def test_more_ranks_than_arrays_and_nothing(name):
    comm = get(name)
    xp = _xp()
    sc = comm.averaging.shard_collectives()
    a = xp.asarray(numpy.full(3, comm.rank + 1.0, numpy.float32))
    sc.mean_to_owners([a], [comm.size - 1])
    if comm.rank == comm.size - 1:
        numpy.testing.assert_allclose(_to_host(a), (comm.size + 1) / 2.0)
    sc.gather_from_owners([a], [comm.size - 1])
    numpy.testing.assert_allclose(_to_host(a), (comm.size + 1) / 2.0)
    sc.mean_to_owners([], [])
    sc.gather_from_owners([], [])


@pytest.mark.parametrize('name', NAMES)
def test_bad_owner_is_refused(name):
    comm = get(name)
    sc = comm.averaging.shard_collectives()
    with pytest.raises(ValueError, match='owner of array 0 is rank'):
        sc.mean_to_owners([numpy.zeros(2, numpy.float32)], [comm.size])
    with pytest.raises(ValueError, match='one owner per array'):
        sc.gather_from_owners([numpy.zeros(2, numpy.float32)], [])


def test_share_plan_covers_every_byte():
    rounds, counts = shard.share_plan([10, 0, 33, 8, 100], [0, 1, 1, 0, 2], 4, 16)
    seen = {}
    for k, per_rank in enumerate(rounds):
        for r, pieces in enumerate(per_rank):
            assert counts[k][r] <= 16
            for i, start, stop, off in pieces:
                assert off + stop - start <= counts[k][r]
                seen.setdefault(i, []).append((start, stop))
    for i, n in enumerate([10, 0, 33, 8, 100]):
        spans = sorted(seen.get(i, []))
        assert sum(b - a for a, b in spans) == n
    assert all(c[3] == 0 for c in counts)  # rank 3 owns nothing


EXPECT_NODE = os.environ.get('CHAINERMN_TEST_SHARD_EXPECT_NODE')


@pytest.mark.skipif(EXPECT_NODE is None or GPU, reason='the launcher says which path to expect')
@pytest.mark.parametrize('name', NAMES)
def test_which_path_carries_the_shares(name):
    comm = get(name)
    sc = comm.averaging.shard_collectives()
    assert sc.on_node_shared_memory() is (EXPECT_NODE == '1' and comm.size > 1)


@pytest.mark.skipif(GPU, reason='host paths')
@pytest.mark.parametrize('name', NAMES)
@pytest.mark.parametrize('kind', ['round', 'one', 'big0'])
def test_node_and_message_paths_give_the_same_bits(name, kind):
    # The node-shared path adds the same terms in the same order as the MPI path: the same bits
    # (across nodes it adds each node's sum first: the same within rounding).
    comm = get(name)
    via_node = comm.averaging.shard_collectives()
    via_mpi = shard.ShardCollectives(comm.mpi_comm, lambda: comm.averaging.guard, chunk=4096)
    terms = _terms(comm.size, seed=11)
    owners = _owners(len(SHAPES), comm.size, kind)
    a = [t.copy() for t in terms[comm.rank]]
    b = [t.copy() for t in terms[comm.rank]]
    via_node.mean_to_owners(a, owners)
    via_mpi.mean_to_owners(b, owners)
    mine = [i for i, r in enumerate(owners) if r == comm.rank]
    if NODES:
        for i in mine:
            tol = 2e-3 if a[i].dtype == numpy.float16 else 1e-6
            numpy.testing.assert_allclose(a[i], b[i], rtol=tol, atol=tol)
    else:
        assert [x.tobytes() for x in a] == [y.tobytes() for y in b]
    via_node.gather_from_owners(a, owners)
    via_mpi.gather_from_owners(b, owners)
    if not NODES:
        assert [x.tobytes() for x in a] == [y.tobytes() for y in b]
    assert comm.allgather_obj([x.tobytes() for x in a]) == [[x.tobytes() for x in a]] * comm.size


@pytest.mark.skipif(GPU, reason='host paths')
@pytest.mark.parametrize('name', NAMES)
def test_non_contiguous_and_many_rounds(name):
    comm = get(name)
    sc = comm.averaging.shard_collectives()
    rng = numpy.random.RandomState(3 + comm.rank)
    base = rng.standard_normal((400, 300)).astype(numpy.float32)
    arrays = [base[:, ::2], rng.standard_normal(70001).astype(numpy.float32),
              (rng.standard_normal(999) + 1j * rng.standard_normal(999)).astype(numpy.complex128)]
    before = [x.copy() for x in arrays]
    every = comm.allgather_obj(before)
    owners = [comm.size - 1, 0, comm.size // 2]
    sc.mean_to_owners(arrays, owners)
    for i, r in enumerate(owners):
        if r == comm.rank:
            want = sum(e[i] for e in every) / comm.size
            numpy.testing.assert_allclose(arrays[i], want, rtol=1e-5, atol=1e-6)
        elif not NODES:
            assert numpy.array_equal(arrays[i], before[i])
    sc.gather_from_owners(arrays, owners)
    assert comm.allgather_obj([x.tobytes() for x in arrays]) == [[x.tobytes() for x in arrays]] * comm.size
