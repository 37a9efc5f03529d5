"""Per-rank tests: the multi-node evaluator returns Chainer's one-process value over all ranks' batches.

Each test builds every rank's batches, evaluates them with ``chainermn.create_multi_node_evaluator``,
then (on every rank) runs Chainer's own ``Evaluator`` in one process over the batches of all ranks
in rank order and compares: lists of examples from ``SerialIterator`` over uneven shards of
``scatter_dataset(..., force_equal_length=False)``, tuple batches of a word2vec-like iterator (a
sum-type loss), dict batches, ``(value, weight)`` reports, a rank with no batch at all.  Then the
mistakes: an iterator that repeats and a ``None`` data set are refused on every rank together,
before a batch is drawn, within seconds.
"""

import time

import chainer
import chainer.functions as F
import chainer.links as L
import numpy
import pytest
from chainer.training import extensions

import chainermn

comm = chainermn.create_communicator('naive')
RANK, SIZE = comm.rank, comm.size
chainer.global_config.dtype = numpy.dtype(numpy.float64)
RTOL = 1e-6


class ListIterator(chainer.dataset.Iterator):
    """Yield the given batches once (the reference: all ranks' batches in one process)."""

    def __init__(self, batches):
        self.batches = batches
        self.reset()

    def reset(self):
        self.position = 0

    def __next__(self):
        if self.position >= len(self.batches):
            raise StopIteration
        self.position += 1
        return self.batches[self.position - 1]


class WindowIterator(chainer.dataset.Iterator):
    """word2vec-like: batches of (center words, context windows) as a tuple of two arrays."""

    def __init__(self, corpus, window, batch_size, repeat=False):
        self.corpus = numpy.asarray(corpus, dtype=numpy.int32)
        self.window, self.batch_size, self.repeat = window, batch_size, repeat
        self.order = numpy.arange(window, len(self.corpus) - window)
        self.reset()

    def reset(self):
        self.epoch, self.position, self.is_new_epoch = 0, 0, False

    def __next__(self):
        if not self.repeat and self.epoch > 0:
            raise StopIteration
        if len(self.order) == 0:
            self.epoch += 1
            raise StopIteration
        pos = self.order[self.position:self.position + self.batch_size]
        self.position += len(pos)
        if self.position >= len(self.order):
            self.epoch, self.position, self.is_new_epoch = self.epoch + 1, 0, True
        offsets = numpy.concatenate([numpy.arange(-self.window, 0), numpy.arange(1, self.window + 1)])
        context = self.corpus[pos[:, None] + offsets[None, :]]
        return self.corpus[pos], context

    @property
    def epoch_detail(self):
        return self.epoch + self.position / max(len(self.order), 1)


class SkipGram(chainer.Chain):
    """A sum-type loss, like Chainer's word2vec example: the loss of a batch grows with its size."""

    def __init__(self, n_vocab, n_units):
        super().__init__()
        rs = numpy.random.RandomState(3)
        with self.init_scope():
            self.embed = L.EmbedID(n_vocab, n_units, initialW=rs.uniform(-1, 1, (n_vocab, n_units)))
            self.out = L.Linear(n_units, n_vocab, initialW=rs.uniform(-1, 1, (n_vocab, n_units)))

    def forward(self, x, contexts):
        e = self.embed(contexts)
        b, w, u = e.shape
        x = F.broadcast_to(x[:, None], (b, w)).reshape(b * w)
        loss = F.softmax_cross_entropy(self.out(e.reshape(b * w, u)), x, reduce='no')
        loss = F.sum(loss)
        chainer.report({'loss': loss}, self)
        return loss


def _columns(batch, device=None):
    """word2vec's converter: the batch is already a tuple of arrays (columns)."""
    return tuple(batch)


def _classifier():
    rs = numpy.random.RandomState(5)
    return L.Classifier(L.Linear(4, 3, initialW=rs.uniform(-1, 1, (3, 4)), initial_bias=rs.uniform(-1, 1, 3)))


def _data(n, seed=1):
    rs = numpy.random.RandomState(seed)
    return chainer.datasets.TupleDataset(rs.standard_normal((n, 4)), rs.randint(0, 3, n).astype(numpy.int32))


def _batches(iterator):
    if len(getattr(iterator, 'dataset', ())) == 0 and hasattr(iterator, 'dataset'):
        return []   # Chainer's SerialIterator cannot iterate over nothing (ZeroDivisionError)
    iterator.reset()
    return list(iterator)


def _reference(all_batches, target, **kwargs):
    ev = extensions.Evaluator(ListIterator(all_batches), target, **kwargs)
    return ev()


def _compare(iterator_factory, target, **kwargs):
    """Evaluate over this rank's iterator; return (multi-node result, Chainer's one-process result)."""
    mine = _batches(iterator_factory())
    everyone = comm.allgather_obj(mine)
    flat = [b for batches in everyone for b in batches]
    ev = chainermn.create_multi_node_evaluator(extensions.Evaluator(iterator_factory(), target, **kwargs), comm)
    got = ev()
    want = _reference(flat, target, **kwargs)
    assert sorted(got) == sorted(want), (got, want)
    for k in want:
        numpy.testing.assert_allclose(float(got[k]), float(want[k]), rtol=RTOL, err_msg=k)
    return got, want, ev


@pytest.mark.parametrize('n', [997, 2])
def test_serial_iterator_over_uneven_shards(n):
    data = _data(n) if RANK == 0 else None
    shard = chainermn.scatter_dataset(data, comm, force_equal_length=False)
    target = _classifier()
    got, want, ev = _compare(
        lambda: chainer.iterators.SerialIterator(shard, 100, repeat=False, shuffle=False), target)
    counts = [n // SIZE + (1 if r < n % SIZE else 0) for r in range(SIZE)]
    assert ev._mn_last_counts == counts
    if n == 997 and SIZE > 1:
        # Weighting each rank by its examples (the old rule) would not give Chainer's value.
        x, t = _data(n)._datasets
        by_example = float(F.softmax_cross_entropy(target.predictor(x), t).array)
        assert abs(by_example - float(want['main/loss'])) > 100 * RTOL * abs(by_example)


def test_tuple_batches_of_a_word2vec_like_iterator():
    corpus = numpy.random.RandomState(7).randint(0, 20, 1003) if RANK == 0 else None
    shard = chainermn.scatter_dataset(corpus, comm, force_equal_length=False)
    words = numpy.asarray([shard[i] for i in range(len(shard))])
    target = SkipGram(20, 6)
    got, want, ev = _compare(lambda: WindowIterator(words, 2, 64), target,
                             converter=_columns)
    # Counted as examples (the tuple's columns), not as 2 per batch.
    assert ev._mn_last_counts == [len(w) - 4 for w in comm.allgather_obj(words)]
    assert all(w == {'main/loss': float(-(-(len(w_) - 4) // 64))}
               for w, w_ in zip(ev._mn_last_weights, comm.allgather_obj(words)))


class DictModel(chainer.Chain):
    def __init__(self):
        super().__init__()
        with self.init_scope():
            self.l = L.Linear(4, 1, initialW=numpy.ones((1, 4)), initial_bias=numpy.zeros(1))

    def forward(self, x, y):
        err = F.mean((self.l(x)[:, 0] - y) ** 2)
        chainer.report({'err': err, 'first': x[0, 0]}, self)
        # A (value, weight) report: Chainer weights it by the batch's examples.
        chainer.report({'per_example': (F.mean(y), len(y))}, self)
        return err


def test_dict_batches_and_weighted_reports():
    rs = numpy.random.RandomState(11 + RANK)
    n = 5 + 7 * RANK
    examples = [{'x': rs.standard_normal(4), 'y': rs.standard_normal()} for _ in range(n)]
    target = DictModel()
    got, want, _ = _compare(lambda: chainer.iterators.SerialIterator(examples, 4, repeat=False, shuffle=False),
                            target)
    ys = [e['y'] for r in comm.allgather_obj(examples) for e in r]
    numpy.testing.assert_allclose(float(got['main/per_example']), numpy.mean(ys), rtol=1e-9)


class SummingEvaluator(extensions.Evaluator):
    """A subclass that computes its value itself: weighted by the rank's examples."""

    def evaluate(self):
        it = self.get_iterator('main')
        it.reset()
        values = [float(v) for batch in it for v in batch[0]]
        return {'custom/mean': numpy.mean(values)}


def test_subclass_keys_weighted_by_examples():
    rs = numpy.random.RandomState(RANK)
    n = 3 + 4 * RANK
    cols = (rs.standard_normal(n), numpy.arange(n))
    it = chainer.iterators.SerialIterator(list(zip(*cols)), 2, repeat=False, shuffle=False)

    class Columns(chainer.dataset.Iterator):   # tuple batches: counted by their columns
        def __init__(self):
            self.inner = it

        def reset(self):
            self.inner.reset()

        def __next__(self):
            return tuple(numpy.asarray(c) for c in zip(*next(self.inner)))

    ev = chainermn.create_multi_node_evaluator(SummingEvaluator(Columns(), chainer.Link()), comm)
    got = ev()
    everything = numpy.concatenate(comm.allgather_obj(cols[0]))
    numpy.testing.assert_allclose(float(got['custom/mean']), everything.mean(), rtol=1e-9)


# -- mistakes: refused together, before any batch is drawn -------------------------------------
def _refused(ev, match):
    started = time.monotonic()
    with pytest.raises(ValueError, match=match) as info:
        ev()
    assert time.monotonic() - started < 10, 'refused, but only after {:.1f} s'.format(time.monotonic() - started)
    assert getattr(info.value, 'chainermn_agreed', None) == 0, info.value
    return str(info.value)


def test_a_repeating_iterator_is_refused():
    it = chainer.iterators.SerialIterator(_data(8 + RANK), 4, shuffle=False)   # repeat=True
    ev = chainermn.create_multi_node_evaluator(extensions.Evaluator(it, _classifier()), comm)
    text = _refused(ev, 'repeat=True')
    assert "iterator 'main' (SerialIterator) has repeat=True" in text and 'repeat=False' in text
    assert text.count('repeat=True, so') == SIZE, text   # every rank named
    assert it.current_position == 0 and it.epoch == 0   # no batch drawn


def test_a_custom_iterator_that_never_stops_is_refused():
    class Endless(WindowIterator):
        repeat = property(lambda self: None, lambda self, v: None)   # hides that it repeats

        def __next__(self):
            before = self.epoch
            batch = WindowIterator.__next__(self) if before == 0 else self._again()
            return batch

        def _again(self):
            self.epoch += 0   # never raises StopIteration
            self.position = 0
            return self.corpus[:1], self.corpus[:1].reshape(1, 1)

    words = numpy.arange(30 + RANK) % 20
    ev = chainermn.create_multi_node_evaluator(
        extensions.Evaluator(Endless(words, 2, 8), SkipGram(20, 3), converter=_columns),
        comm)
    text = _refused(ev, 'second pass')
    assert "iterator 'main' (Endless) began a second pass" in text and 'repeat=False' in text


def test_a_none_data_set_on_other_ranks_is_refused():
    data = _data(9) if RANK == 0 else None
    it = chainer.iterators.SerialIterator(data, 4, repeat=False, shuffle=False)
    ev = chainermn.create_multi_node_evaluator(extensions.Evaluator(it, _classifier()), comm)
    if SIZE == 1:
        assert 'main/loss' in ev()
        return
    text = _refused(ev, 'dataset=None')
    for r in range(1, SIZE):
        assert "rank {}: the evaluator's iterator 'main' (SerialIterator) iterates over dataset=None".format(r) in text
    assert 'rank 0:' not in text.split('cannot evaluate:')[1]
    assert 'chainermn.scatter_dataset(test, comm)' in text
