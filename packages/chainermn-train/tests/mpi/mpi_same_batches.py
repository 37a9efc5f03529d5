"""Identical first batches on the ranks of a multi-node optimizer's communicator are named once (run under mpiexec)."""

import os
import sys
import warnings

import chainer
import chainer.links as L
import numpy
import pytest

sys.path.insert(0, os.path.dirname(__file__))
import _common  # noqa: E402

import chainermn_train  # noqa: E402
from chainermn_train import _fingerprint  # noqa: E402

COMM = _common.comm()
RANK, SIZE = COMM.rank, COMM.size


@pytest.fixture(autouse=True)
def _warn_again(monkeypatch):
    monkeypatch.setattr(_fingerprint, '_warned_batches', False)


def _data(seed, n=24):
    rs = numpy.random.RandomState(seed)
    x = rs.standard_normal((n, 4)).astype(numpy.float32)
    t = rs.randint(0, 3, n).astype(numpy.int32)
    return chainer.datasets.TupleDataset(x, t)


def _train_once(comm, data, updates=2, record=True):
    numpy.random.seed(0)   # the same initial parameters on every rank
    model = L.Classifier(_common.MLP(4, 5, 3))
    opt = chainermn_train.create_multi_node_optimizer(chainer.optimizers.SGD(lr=0.1), comm)
    opt.setup(model)
    it = chainer.iterators.SerialIterator(data, 4, shuffle=False)
    updater = chainer.training.updaters.StandardUpdater(it, opt)
    if not record:
        updater.update()
        return None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        for _ in range(updates):
            updater.update()
    return [str(w.message) for w in caught if issubclass(w.category, chainermn_train.IdenticalBatchesWarning)]


def test_every_rank_on_the_whole_data_set_is_named_once():
    shown = _train_once(COMM, _data(1))   # no scatter_dataset: every rank the same batches
    if SIZE == 1:
        assert shown == []
        return
    assert len(shown) == (1 if RANK == 0 else 0), shown   # rank 0 shows it, once (not per update)
    if RANK == 0:
        text = shown[0]
        assert text.startswith('ranks {} of the multi-node optimizer\'s communicator ({} ranks) fed identical '
                               'batches to its first update'.format(', '.join(map(str, range(SIZE))), SIZE)), text
        assert 'chainermn.scatter_dataset(train, comm, shuffle=True, seed=0)' in text
        assert 'numpy.random.seed(seed + comm.rank)' in text
    # Once per process: a second optimizer (a GAN's) says nothing more.
    assert _train_once(COMM, _data(1)) == []


def test_some_ranks_alike_are_named():
    if SIZE < 3:
        pytest.skip('needs 3 ranks')
    shown = _train_once(COMM, _data(1 if RANK < 2 else 2))
    assert len(shown) == (1 if RANK == 0 else 0), shown
    if RANK == 0:
        assert shown[0].startswith('ranks 0, 1 of the'), shown


def test_own_batches_are_not_named():
    assert _train_once(COMM, _data(100 + RANK)) == []


def test_filters_act_alike_on_every_rank():
    if SIZE == 1:
        return
    with warnings.catch_warnings():
        warnings.simplefilter('error', chainermn_train.IdenticalBatchesWarning)
        with pytest.raises(chainermn_train.IdenticalBatchesWarning):
            _train_once(COMM, _data(1), record=False)   # raised on every rank at the same point


def test_a_model_parallel_group_sharing_batches_is_not_named():
    # Ranks 2k and 2k+1 form a model-parallel group and share its batches (as a multi-node iterator
    # over the group would); the multi-node optimizer averages over the ranks of the same parity,
    # which all hold other batches.
    group = RANK // 2
    data_comm = COMM.split(RANK % 2, RANK)
    assert _train_once(data_comm, _data(200 + group)) == []


def test_batches_without_arrays_are_not_compared():
    numpy.random.seed(0)
    model = L.Linear(2, 1)
    opt = chainermn_train.create_multi_node_optimizer(chainer.optimizers.SGD(), COMM)
    opt.setup(model)
    x = numpy.ones((3, 2), numpy.float32)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        opt.update(lambda: chainer.functions.sum(model(x)))   # create_empty_dataset's ranks: no batch
    assert not [w for w in caught if issubclass(w.category, chainermn_train.IdenticalBatchesWarning)]


def test_batch_digest():
    a = numpy.arange(6, dtype=numpy.float32).reshape(3, 2)
    assert _fingerprint.batch_digest(((a, a[:, 0]), {})) == _fingerprint.batch_digest(((a.copy(), a[:, 0].copy()), {}))
    assert _fingerprint.batch_digest(((a,), {})) != _fingerprint.batch_digest(((a + 1,), {}))
    assert _fingerprint.batch_digest(((a,), {})) != _fingerprint.batch_digest(((a.astype(numpy.float64),), {}))
    assert _fingerprint.batch_digest(((chainer.Variable(a),), {})) == _fingerprint.batch_digest(((a,), {}))
    assert _fingerprint.batch_digest(((), {})) is None
    assert _fingerprint.batch_digest(([(), ()], {})) is None
    assert _fingerprint.batch_digest(None) is None
