"""Per-rank tests of scatter_dataset (run on every rank under mpiexec)."""

import math
import threading

import chainer
import numpy
import pytest
from chainer.datasets import DictDataset, SubDataset, TupleDataset
from mpi4py import MPI

import chainermn_comm
from chainermn_comm import voice
import chainermn_data
from chainermn_data import _scatter
from chainermn_data.datasets import create_empty_dataset

comm = chainermn_comm.create_communicator('naive')
RANK, SIZE = comm.rank, comm.size


def gather_parts(part):
    return comm.allgather_obj([part[i] for i in range(len(part))])


def expected_parts(n, shuffle, seed, force):
    order = numpy.random.RandomState(seed).permutation(n) if shuffle else numpy.arange(n)
    return [[int(order[p]) for p in _scatter.part_positions(n, SIZE, r, force)] for r in range(SIZE)]


@pytest.mark.parametrize('n', [0, 1, 2, 3, 5, 7, 10, 11, 100])
@pytest.mark.parametrize('shuffle', [False, True])
@pytest.mark.parametrize('force', [True, False])
def test_every_sample_once_plus_padding(n, shuffle, force):
    data = list(range(n)) if RANK == 0 else None
    part = chainermn_data.scatter_dataset(data, comm, shuffle=shuffle, seed=42, force_equal_length=force)
    assert isinstance(part, SubDataset)
    parts = gather_parts(part)
    assert parts == expected_parts(n, shuffle, 42, force)
    counts = numpy.bincount(numpy.concatenate([numpy.asarray(p, dtype=int) for p in parts] + [[]]).astype(int),
                            minlength=n) if n else numpy.zeros(0)
    lengths = [len(p) for p in parts]
    if n:
        assert counts.min() >= 1
    if force:
        assert lengths == [math.ceil(n / SIZE)] * SIZE
        # Documented padding: exactly ceil(n/size)*size - n repeats (unless n < size: all pad sample 0).
        assert int(counts.sum()) - n == math.ceil(n / SIZE) * SIZE - n
        for r in range(SIZE):
            q, rem = divmod(n, SIZE)
            if rem and r >= rem and n >= SIZE:
                nxt = (r + 1) % SIZE
                first_of_next = parts[nxt][0]
                assert parts[r][-1] == first_of_next
    else:
        assert counts.tolist() == [1] * n
        assert max(lengths) - min(lengths) <= 1
        assert sum(lengths) == n


def test_seed_determinism():
    data = list(range(200)) if RANK == 0 else None
    a = gather_parts(chainermn_data.scatter_dataset(data, comm, shuffle=True, seed=7))
    b = gather_parts(chainermn_data.scatter_dataset(data, comm, shuffle=True, seed=7))
    c = gather_parts(chainermn_data.scatter_dataset(data, comm, shuffle=True, seed=8))
    assert a == b
    assert a != c
    everything = sum(a, [])
    assert sorted(set(everything)) == list(range(200))
    assert len(everything) == math.ceil(200 / SIZE) * SIZE


def _datasets():
    x = numpy.arange(60, dtype=numpy.float32).reshape(20, 3)
    y = numpy.arange(20, dtype=numpy.int64) * 7

    class Custom:
        def __len__(self):
            return 13

        def __getitem__(self, i):
            if not 0 <= i < 13:
                raise IndexError(i)
            return {'i': i, 'sq': numpy.full((2,), i * i, dtype=numpy.int16)}

    return {
        'list': [(i, str(i)) for i in range(17)],
        'ndarray2d': x,
        'ndarray1d': y,
        'ndarray_noncontig': x[:, ::2].T.copy().T,
        'ndarray_structured': numpy.array([(i, i * 0.5) for i in range(9)], dtype=[('a', 'i4'), ('b', 'f8')]),
        'ndarray_object': numpy.array([{'k': i} for i in range(6)], dtype=object),
        'tuple': TupleDataset(x, y),
        'dict': DictDataset(a=x, b=y),
        'sub': SubDataset(list(range(100, 140)), 5, 30),
        'sub_order': SubDataset(list(range(100, 140)), 3, 25, order=numpy.arange(40)[::-1].copy()),
        'custom': Custom(),
    }


def _same(a, b):
    if isinstance(a, dict):
        assert sorted(a) == sorted(b)
        for k in a:
            _same(a[k], b[k])
    elif isinstance(a, (tuple, list)):
        assert len(a) == len(b)
        for u, v in zip(a, b):
            _same(u, v)
    elif isinstance(a, numpy.ndarray) or isinstance(b, numpy.ndarray):
        numpy.testing.assert_array_equal(numpy.asarray(a), numpy.asarray(b))
        assert numpy.asarray(a).dtype == numpy.asarray(b).dtype
    else:
        # Root's part indexes its dataset through SubDataset's order (numpy ints), like Chainer does.
        assert a == b and (type(a) == type(b) or isinstance(a, (int, numpy.integer)))


@pytest.mark.parametrize('name', sorted(_datasets()))
@pytest.mark.parametrize('shuffle', [False, True])
@pytest.mark.parametrize('raw', [False, True])
def test_dataset_types(name, shuffle, raw):
    full = _datasets()[name]
    root = SIZE - 1
    part = chainermn_data.scatter_dataset(full if RANK == root else None, MPI.COMM_WORLD if raw else comm,
                                          root=root, shuffle=shuffle, seed=3)
    n = len(full)
    order = numpy.random.RandomState(3).permutation(n) if shuffle else numpy.arange(n)
    want = [int(order[p]) for p in _scatter.part_positions(n, SIZE, RANK, True)]
    assert len(part) == len(want) == math.ceil(n / SIZE)
    for i, j in enumerate(want):
        _same(part[i], full[j])


def test_root_part_is_a_view():
    items = [object() for _ in range(10)]
    part = chainermn_data.scatter_dataset(items if RANK == 0 else [1, 2], comm)
    if RANK == 0:
        assert all(part[i] is items[i] for i in range(len(part)))


@pytest.mark.parametrize('max_buf_len', [7, 64, 250, 100000])
@pytest.mark.parametrize('kind', ['ndarray', 'objects'])
def test_parts_sent_in_pieces(monkeypatch, max_buf_len, kind):
    sizes = []
    real = _scatter._probe_error

    def spy(work, root, status):
        err = real(work, root, status)
        sizes.append(status.Get_count(MPI.BYTE))
        return err

    monkeypatch.setattr(_scatter, '_probe_error', spy)
    if kind == 'ndarray':
        full = numpy.arange(40 * 25, dtype=numpy.float32).reshape(40, 25)  # 100-byte rows
    else:
        full = [numpy.full((i % 7 + 1) * 10, i, dtype=numpy.int32) for i in range(40)]
    part = chainermn_data.scatter_dataset(full if RANK == 0 else None, comm, shuffle=True, seed=1,
                                          max_buf_len=max_buf_len)
    want = [int(numpy.random.RandomState(1).permutation(40)[p])
            for p in _scatter.part_positions(40, SIZE, RANK, True)]
    for i, j in enumerate(want):
        numpy.testing.assert_array_equal(part[i], full[j])
    if RANK != 0:
        assert sizes and max(sizes) <= max_buf_len
        if max_buf_len < 1000:
            assert len(sizes) > 2
        assert sum(sizes) >= sum(numpy.asarray(full[j]).nbytes for j in want)


@pytest.mark.parametrize('bad_on', ['all', 'root', 'other'])
def test_max_buf_len_limit(bad_on):
    bad = {'all': True, 'root': RANK == 0, 'other': RANK == SIZE - 1}[bad_on]
    with pytest.raises(ValueError, match='2147483647'):
        chainermn_data.scatter_dataset(list(range(5)), comm, max_buf_len=2 ** 31 if bad else 1024)
    part = chainermn_data.scatter_dataset(list(range(5)), comm, max_buf_len=2147483647)
    assert len(part) == math.ceil(5 / SIZE)


def test_unpicklable_everywhere():
    data = [threading.Lock() for _ in range(6)] if RANK == 0 else None
    with pytest.raises(TypeError, match='lock'):
        chainermn_data.scatter_dataset(data, comm)


def test_unpicklable_late_sample():
    data = list(range(11)) + [lambda: 0] if RANK == 0 else None
    if SIZE == 1:
        chainermn_data.scatter_dataset(data, comm)  # root's part is never pickled past sample 0
        return
    with pytest.raises(TypeError, match='function'):
        chainermn_data.scatter_dataset(data, comm)
    # The communicator is still usable afterwards.
    assert gather_parts(chainermn_data.scatter_dataset(list(range(4)) if RANK == 0 else None, comm)) == \
        expected_parts(4, False, None, True)


def test_getitem_error_everywhere():
    class Broken:
        def __len__(self):
            return 8

        def __getitem__(self, i):
            raise KeyError('boom')

    with pytest.raises((RuntimeError, TypeError), match='boom'):
        chainermn_data.scatter_dataset(Broken() if RANK == 0 else None, comm)


def test_root_none_and_bad_root():
    # Every rank raises each together, after one exchange: rank 0 reports it, once.
    with pytest.raises(ValueError, match='dataset=None') as e:
        chainermn_data.scatter_dataset(None, comm)
    assert voice.reporter_of(e.value) == 0
    with pytest.raises(ValueError, match='root') as e:
        chainermn_data.scatter_dataset([1], comm, root=SIZE)
    assert voice.reporter_of(e.value) == 0
    if SIZE > 1:
        with pytest.raises(ValueError, match='same root') as e:
            chainermn_data.scatter_dataset([1, 2], comm, root=RANK)
        assert voice.reporter_of(e.value) == 0


def test_bad_seed_everywhere():
    with pytest.raises(ValueError, match='seed'):
        chainermn_data.scatter_dataset(list(range(4)), comm, shuffle=True, seed=-5)


def test_create_empty_dataset():
    # ChainerMN 1.3.1 returns [()] * len(dataset): a list of empty tuples (its docstring says None).
    class NeverRead:
        def __len__(self):
            return 7

        def __getitem__(self, i):
            raise AssertionError('create_empty_dataset read sample {}'.format(i))

    e = create_empty_dataset(NeverRead())
    assert type(e) is list and len(e) == 7 and e == [()] * 7
    assert create_empty_dataset(TupleDataset(numpy.zeros(3), numpy.ones(3))) == [(), (), ()]
    # The default converter turns a batch of them into a call with no arguments.
    batch = next(chainer.iterators.SerialIterator(e, 3, shuffle=True))
    assert batch == [()] * 3 and chainer.dataset.concat_examples(batch) == ()
    with pytest.raises(TypeError, match='__len__'):
        create_empty_dataset(iter([1, 2]))
    part = chainermn_data.scatter_dataset(create_empty_dataset(list(range(9))), comm, shuffle=True)
    assert len(part) == math.ceil(9 / SIZE) and all(part[i] == () for i in range(len(part)))


def test_root_none_names_the_ranks_that_loaded_it():
    loaded = list(range(5)) if RANK == SIZE - 1 and SIZE > 1 else None   # loaded on the last rank, root is 0
    with pytest.raises(ValueError, match='dataset=None') as e:
        chainermn_data.scatter_dataset(loaded, comm)
    assert voice.reporter_of(e.value) == 0
    text = str(e.value)
    if SIZE > 1:
        assert 'root 0 passed dataset=None; rank(s) {} passed one'.format(SIZE - 1) in text, text
        assert 'or pass root=R for the rank R that loaded it' in text, text
    assert 'load it on rank 0' in text, text
    with pytest.raises(TypeError, match='comm.bcast_obj'):
        create_empty_dataset(None)
