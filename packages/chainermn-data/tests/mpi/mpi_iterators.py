"""Per-rank tests of the multi-node and synchronized iterators (run on every rank under mpiexec)."""

import io

import numpy
import pytest
from chainer import serializers
from chainer.iterators import MultiprocessIterator, SerialIterator
from mpi4py import MPI

import chainermn_comm
from chainermn_comm import voice
from chainermn_data import create_multi_node_iterator, create_synchronized_iterator
from chainermn_data.iterators import IteratorMismatchError

comm = chainermn_comm.create_communicator('naive')
RANK, SIZE = comm.rank, comm.size
MASTER = SIZE - 1


def _same(a, b):
    if isinstance(a, dict):
        assert sorted(a) == sorted(b)
        for k in a:
            _same(a[k], b[k])
    elif isinstance(a, (tuple, list)):
        assert type(a) == type(b) and len(a) == len(b)
        for u, v in zip(a, b):
            _same(u, v)
    elif isinstance(a, numpy.ndarray):
        assert isinstance(b, numpy.ndarray) and a.dtype == b.dtype and a.shape == b.shape
        numpy.testing.assert_array_equal(a, b)
    else:
        assert a == b and type(a) == type(b)


def assert_same_on_all_ranks(value):
    everyone = comm.allgather_obj(value)
    for other in everyone:
        _same(other, everyone[0])
    return everyone[0]


def state(it):
    return (it.epoch, it.is_new_epoch, it.epoch_detail, it.previous_epoch_detail)


def dataset():
    out = []
    for i, dt in enumerate([numpy.int8, numpy.uint16, numpy.int64, numpy.float16, numpy.float32,
                            numpy.float64, numpy.complex64, numpy.bool_] * 3):
        x = (numpy.arange(6).reshape(2, 3) + i).astype(dt)
        if i % 3 == 0:
            out.append((x, numpy.int32(i)))
        elif i % 3 == 1:
            out.append({'x': x, 'label': numpy.array(i, dtype=numpy.int64)})
        else:
            out.append(x)
    return out


def draw(it, count):
    got = []
    for _ in range(count):
        try:
            batch = it.next()
        except StopIteration:
            got.append('stop')
            assert_same_on_all_ranks('stop')
            break
        got.append((batch, state(it)))
        assert_same_on_all_ranks((batch, state(it)))
    return got


@pytest.mark.parametrize('batch_size', [1, 5, 24])
@pytest.mark.parametrize('shuffle', [False, True])
def test_multi_node_repeat(batch_size, shuffle):
    data = dataset()
    numpy.random.seed(RANK)  # only the master's RNG may matter
    actual = SerialIterator(data, batch_size, shuffle=shuffle) if RANK == MASTER else None
    it = create_multi_node_iterator(actual, comm, rank_master=MASTER)
    assert assert_same_on_all_ranks(it.batch_size) == batch_size
    epochs = 3
    seen = []
    while it.epoch < epochs:
        batch = it.next()
        assert_same_on_all_ranks((batch, state(it)))
        seen.extend(batch)
        if it.is_new_epoch:
            assert it.epoch <= it.epoch_detail < it.epoch + 1
    assert len(seen) >= epochs * len(data)
    if not shuffle:
        for i, sample in enumerate(seen):
            _same(sample, data[i % len(data)])


@pytest.mark.parametrize('batch_size', [4, 7])
def test_multi_node_no_repeat(batch_size):
    data = dataset()
    actual = SerialIterator(data, batch_size, repeat=False, shuffle=True) if RANK == 0 else None
    it = create_multi_node_iterator(actual, comm)
    seen = []
    for batch in it:
        assert_same_on_all_ranks((batch, state(it)))
        seen.extend(batch)
    assert len(seen) == len(data)
    with pytest.raises(StopIteration):
        it.next()
    it.reset()
    again = [b for b in it]
    assert sum(len(b) for b in again) == len(data)
    assert_same_on_all_ranks(again)


@pytest.mark.parametrize('repeat', [True, False])
def test_multi_node_serialize_resume(tmp_path, repeat):
    data = dataset()

    def make():
        actual = SerialIterator(data, 5, repeat=repeat, shuffle=True) if RANK == MASTER else None
        return create_multi_node_iterator(actual, comm, rank_master=MASTER)

    numpy.random.seed(100 + RANK)
    a = make()
    draw(a, 3)
    saved = serializers.DictionarySerializer()
    a.serialize(saved)
    assert_same_on_all_ranks(sorted(saved.target))
    assert int(saved.target['epoch']) == 0
    buf = io.BytesIO()
    numpy.savez(buf, **saved.target)
    numpy.random.seed(7)
    rest_a = draw(a, 6)

    numpy.random.seed(55 + 3 * RANK)
    b = make()
    draw(b, 1)  # the fresh iterator's state must be replaced entirely
    buf.seek(0)
    with numpy.load(buf, allow_pickle=True) as npz:
        b.serialize(serializers.NpzDeserializer(npz))
    assert_same_on_all_ranks(state(b))
    numpy.random.seed(7)
    rest_b = draw(b, 6)
    assert len(rest_a) == len(rest_b) and len(rest_a) >= 2
    assert (rest_a[-1] == 'stop') == (not repeat)
    for x, y in zip(rest_a, rest_b):
        _same(x, y)


@pytest.mark.parametrize('n_processes', [1, 2])
def test_multi_node_multiprocess(n_processes):
    data = [numpy.full(3, i, dtype=numpy.float32) for i in range(10)]
    actual = MultiprocessIterator(data, 4, repeat=True, shuffle=False, n_processes=n_processes,
                                  n_prefetch=1) if RANK == 0 else None
    it = create_multi_node_iterator(actual, comm)
    try:
        got = draw(it, 6)
    finally:
        it.finalize()
    flat = [s for batch, _ in got for s in batch]
    for i, s in enumerate(flat):
        numpy.testing.assert_array_equal(s, data[i % 10])


def test_multi_node_raw_mpi4py_comm():
    actual = SerialIterator(list(range(9)), 2, repeat=False, shuffle=False) if RANK == 0 else None
    it = create_multi_node_iterator(actual, MPI.COMM_WORLD)
    assert assert_same_on_all_ranks([b for b in it]) == [[0, 1], [2, 3], [4, 5], [6, 7], [8]]


def test_multi_node_mismatch_detected():
    if SIZE == 1:
        return
    with pytest.raises(IteratorMismatchError, match='rank_master') as e:
        create_multi_node_iterator(SerialIterator([1, 2], 1), comm, rank_master=RANK)
    assert voice.reporter_of(e.value) == 0   # raised together: rank 0 reports it, once
    it = create_multi_node_iterator(SerialIterator([1, 2, 3], 1), comm)
    with pytest.raises(IteratorMismatchError, match='next/reset/serialize') as e:
        if RANK == 0:
            it.next()
        else:
            it.reset()
    assert voice.reporter_of(e.value) == 0
    assert assert_same_on_all_ranks(it.next()) in ([1], [2])


def test_multi_node_master_error_everywhere():
    class Broken:
        batch_size = 1
        epoch = 0

        def __next__(self):
            raise KeyError('no sample')

    it = create_multi_node_iterator(Broken() if RANK == 0 else None, comm)
    expected = KeyError if RANK == 0 else RuntimeError
    with pytest.raises(expected, match='no sample'):
        it.next()
    with pytest.raises(ValueError, match='needs an iterator') as e:
        create_multi_node_iterator(None, comm)
    assert voice.reporter_of(e.value) == 0


@pytest.mark.parametrize('kind', ['serial', 'multiprocess'])
def test_synchronized(kind):
    n = 12
    data = [RANK * 1000 + i for i in range(n)]
    numpy.random.seed(RANK * 17 + 1)  # different global RNG state on every rank
    if kind == 'serial':
        actual = SerialIterator(data, 5, shuffle=True)
    else:
        actual = MultiprocessIterator(data, 5, shuffle=True, n_processes=1, n_prefetch=1)
    it = create_synchronized_iterator(actual, comm)
    assert it is actual
    try:
        for _ in range(8):
            batch = it.next()
            assert all(x // 1000 == RANK for x in batch)
            assert_same_on_all_ranks(([x - RANK * 1000 for x in batch], state(it)))
    finally:
        if kind == 'multiprocess':
            it.finalize()


def test_synchronized_serialize_resume():
    data = [RANK * 1000 + i for i in range(11)]
    numpy.random.seed(RANK)
    it = create_synchronized_iterator(SerialIterator(data, 3, shuffle=True), comm)
    for _ in range(2):
        it.next()
    saved = serializers.DictionarySerializer()
    it.serialize(saved)
    numpy.random.seed(RANK + 50)
    it2 = create_synchronized_iterator(SerialIterator(data, 3, shuffle=True), comm)
    it2.serialize(serializers.NpzDeserializer({k: numpy.asarray(v) for k, v in saved.target.items()}))
    for _ in range(9):
        batch = it2.next()
        assert_same_on_all_ranks([x - RANK * 1000 for x in batch])


def test_synchronized_mismatch():
    if SIZE == 1:
        return
    with pytest.raises(ValueError, match='length') as e:
        create_synchronized_iterator(SerialIterator(list(range(10 + RANK)), 2), comm)
    assert voice.reporter_of(e.value) == 0   # raised together: rank 0 reports it, once
    with pytest.raises(ValueError, match='shuffl') as e:
        create_synchronized_iterator(SerialIterator(list(range(10)), 2, shuffle=RANK == 0), comm)
    assert voice.reporter_of(e.value) == 0


def test_a_none_data_set_is_named_with_the_fix():
    """Only rank 0 loaded the data: each iterator names it on every rank together, with the fix."""
    from chainermn_data.iterators import create_elastic_iterator
    # The master draws from dataset=None (SerialIterator(None, n, shuffle=False) can be made).
    with pytest.raises(ValueError, match='dataset=None') as e:
        create_multi_node_iterator(SerialIterator(None, 2, shuffle=False) if RANK == MASTER else None, comm,
                                   rank_master=MASTER)
    assert voice.reporter_of(e.value) == 0
    assert "rank {}: the master rank's chainer.iterators.serial_iterator.SerialIterator iterates over " \
           "dataset=None".format(MASTER) in str(e.value), str(e.value)
    assert 'rank_master={}'.format(MASTER) in str(e.value)
    if SIZE == 1:
        return
    # Synchronized: every rank needs its own data set; ranks other than 0 got None.
    data = list(range(6)) if RANK == 0 else None
    with pytest.raises(ValueError, match='dataset=None') as e:
        create_synchronized_iterator(SerialIterator(data, 2, shuffle=False), comm)
    assert voice.reporter_of(e.value) == 0
    text = str(e.value)
    for r in range(1, SIZE):
        assert 'rank {}: the chainer.iterators.serial_iterator.SerialIterator iterates over dataset=None'.format(r) \
            in text, text
    assert 'rank 0:' not in text.split('create_synchronized_iterator: ')[1], text
    assert 'chainermn.scatter_dataset(train, comm)' in text, text
    # Elastic: every rank passes the whole data set.
    with pytest.raises(ValueError, match='do not scatter it') as e:
        create_elastic_iterator(data, 2, comm)
    assert voice.reporter_of(e.value) == 0
