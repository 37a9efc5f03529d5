"""The elastic iterator without MPI: simulated ranks, epochs and a resize mid-epoch."""

import collections

import chainer
import numpy
import pytest

from chainermn_data.iterators import ElasticIterator


def _ranks(size, n=23, batch=3, seed=5, shuffle=True):
    data = list(range(n))
    return [ElasticIterator(data, batch, r, size, shuffle, seed) for r in range(size)]


def _step(its):
    """Advance every simulated rank once; return ``[(position, sample), ...]`` of the whole step."""
    out = []
    for it in its:
        batch = next(it)
        out += list(zip(it.last_positions.tolist(), batch))
    return out


def _save(it):
    ser = chainer.serializers.DictionarySerializer()
    ser.save(it)
    return ser.target


def _load(it, target):
    chainer.serializers.NpzDeserializer(target).load(it)


@pytest.mark.parametrize('shuffle', [True, False])
def test_each_epoch_is_one_permutation_split_across_ranks(shuffle):
    n = 23
    its = _ranks(4, n=n, shuffle=shuffle)
    seen = []
    for _ in range(6):   # 6 steps x 12 samples = 72 positions: epochs 0-2 complete
        seen += _step(its)
    positions = [p for p, _ in seen]
    assert sorted(positions) == list(range(72))
    for epoch in range(3):
        samples = [s for p, s in seen if p // n == epoch]
        assert sorted(samples) == list(range(n))
    first = [s for p, s in sorted(seen) if p < n]
    assert (first != list(range(n))) == shuffle
    assert its[0].epoch == 3 and its[0].epoch_detail == pytest.approx(72 / n)


@pytest.mark.parametrize('old,new', [(4, 3), (4, 2), (2, 6), (3, 1)])
def test_resize_mid_epoch_consumes_every_remaining_sample_once(old, new):
    n = 50
    its = _ranks(old, n=n, seed=11)
    seen = _step(its) + _step(its)
    states = [_save(it) for it in its]
    assert all(set(s) == set(states[0]) and all(numpy.array_equal(s[k], states[0][k]) for k in s)
               for s in states)   # the same state on every rank
    resumed = _ranks(new, n=n, seed=999)   # the snapshot's seed wins
    for it in resumed:
        _load(it, states[0])
    while resumed[0].epoch < 1:
        seen += _step(resumed)
    epoch0 = collections.Counter(s for p, s in seen if p < n)
    assert sorted(epoch0) == list(range(n)) and set(epoch0.values()) == {1}


def test_loading_a_snapshot_of_another_dataset_is_an_error():
    a = _ranks(1, n=10)[0]
    b = _ranks(1, n=11)[0]
    with pytest.raises(ValueError, match='saved over 10 samples but this one has 11'):
        _load(b, _save(a))


def test_without_repeat_one_epoch_then_stop():
    data = list(range(10))
    its = [ElasticIterator(data, 3, r, 2, False, 0, repeat=False) for r in range(2)]
    got = []
    with pytest.raises(StopIteration):
        while True:
            got += _step(its)
    assert sorted(s for _, s in got) == data
