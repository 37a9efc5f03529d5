"""Per-rank tests (under mpiexec, an even number of ranks): one forward pass per update.

Ranks form pairs (``model_comm``) holding the two parts of one model; the ranks holding the same
part form ``data_comm`` (size 1 at 2 ranks).  The front part (eager Linear, BatchNormalization)
sends to the back part (lazily initialised Linear, BatchNormalization, random noise), which sends
back to the front's loss.  Every forward of every rank is counted.
"""

import os

import chainer
import chainer.functions as F
import chainer.links as L
import numpy
import pytest
from chainer import training

import chainermn

COMM = chainermn.create_communicator('naive')
RANK, SIZE = COMM.rank, COMM.size
N_TRAIN, N_TEST, BATCH, UPDATES = 48, 16, 4, 5


class Counted(chainer.Chain):
    """Linear (lazy or not) + BatchNormalization (+ noise on the back part); counts its calls."""

    def __init__(self, n_in, n_out, noise=False):
        super().__init__()
        self.calls = 0
        self.noise = noise
        with self.init_scope():
            self.l = L.Linear(n_in, n_out)
            self.bn = L.BatchNormalization(n_out)

    def forward(self, x):
        self.calls += 1
        h = self.bn(self.l(x))
        if self.noise and chainer.config.train:   # draws random numbers, like dropout
            h = h + numpy.random.standard_normal(h.shape).astype(h.dtype) * 1e-3
        return h


class Out(chainer.Chain):
    def __init__(self):
        super().__init__()
        self.calls = 0
        with self.init_scope():
            self.l = L.Linear(6, 3)

    def forward(self, h):
        self.calls += 1
        return self.l(h)


def make_comms():
    data_axis, model_axis = RANK % 2, RANK // 2
    return COMM.split(data_axis, RANK), COMM.split(model_axis, RANK)


def make_part(model_comm):
    model = chainermn.MultiNodeChainList(model_comm)
    if model_comm.rank == 0:
        counted = [Counted(4, 5), Out()]
        model.add_link(counted[0], rank_in=None, rank_out=1)
        model.add_link(counted[1], rank_in=1, rank_out=None)
    else:
        counted = [Counted(None, 6, noise=True)]   # lazily initialised
        model.add_link(counted[0], rank_in=0, rank_out=0)
    return model, counted


class Loss(chainer.Chain):
    """The front's loss function (mean squared error); the back part just returns its delegate."""

    def __init__(self, model, front):
        super().__init__()
        self.front = front
        with self.init_scope():
            self.model = model

    def forward(self, *batch):
        if not self.front:
            assert batch == ()
            return self.model()
        x, y = batch
        return F.mean_squared_error(self.model(x), y)


def datasets(data_comm, model_comm):
    rs = numpy.random.RandomState(0)
    x = rs.standard_normal((N_TRAIN + N_TEST, 4)).astype(numpy.float32)
    y = rs.standard_normal((N_TRAIN + N_TEST, 3)).astype(numpy.float32)
    train = chainer.datasets.TupleDataset(x[:N_TRAIN], y[:N_TRAIN])
    test = chainer.datasets.TupleDataset(x[N_TRAIN:], y[N_TRAIN:])
    if model_comm.rank == 1:
        train = chainermn.datasets.create_empty_dataset(train)
        test = chainermn.datasets.create_empty_dataset(test)
    return (chainermn.scatter_dataset(train, data_comm, shuffle=True, seed=1),
            chainermn.scatter_dataset(test, data_comm, shuffle=True, seed=1))


def assert_same_in(data_comm, model, what):
    mine = {n: p.array for n, p in sorted(model.namedparams())}
    for r, theirs in enumerate(data_comm.allgather_obj(mine)):
        assert sorted(theirs) == sorted(mine)
        for n in mine:
            assert numpy.array_equal(theirs[n], mine[n]), \
                'rank {}: {} differs from data_comm rank {} {}'.format(RANK, n, r, what)


@pytest.mark.parametrize('options', [
    {}, {'double_buffering': True}, {'overlap': True, 'mode': 'end'},
    {'overlap': True, 'mode': 'thread'}])
def test_one_forward_per_update(options, monkeypatch):
    options = dict(options)
    mode = options.pop('mode', None)
    if mode is not None:
        monkeypatch.setenv('CHAINERMN_OVERLAP_MODE', mode)
    assert SIZE % 2 == 0
    data_comm, model_comm = make_comms()
    numpy.random.seed(10 + RANK)   # each rank's lazy parameters start different
    front = model_comm.rank == 0
    model, counted = make_part(model_comm)
    loss = Loss(model, front)
    opt = chainermn.create_multi_node_optimizer(chainer.optimizers.Adam(alpha=0.01), data_comm,
                                                **options)
    opt.setup(loss)
    train, test = datasets(data_comm, model_comm)
    it = chainer.iterators.SerialIterator(train, BATCH, shuffle=False)
    updater = training.StandardUpdater(it, opt)     # the default converter
    before = None
    for k in range(1, UPDATES + 1):
        updater.update()
        assert [c.calls for c in counted] == [k] * len(counted), (RANK, k)
        assert_same_in(data_comm, loss, 'after update {}'.format(k))
        now = {n: p.array.copy() for n, p in loss.namedparams()}
        if front:
            assert opt.t == k   # its parameters existed: every update updates
        else:
            # The lazy parameters appeared in the first forward pass: that update only took
            # data_comm rank 0's values; every later one updates.
            assert opt.t == k - 1
        if before is not None:
            assert any(not numpy.array_equal(now[n], before[n]) for n in now), (RANK, k)
        before = now
    assert numpy.abs(counted[0].bn.avg_mean).sum() > 0   # the statistics were updated

    # The evaluator runs each test batch through the model once on every rank, too.
    opt.finish()
    test_it = chainer.iterators.SerialIterator(test, BATCH, repeat=False, shuffle=False)
    ev = chainermn.create_multi_node_evaluator(
        chainer.training.extensions.Evaluator(test_it, loss), data_comm)
    calls = [c.calls for c in counted]
    with chainer.Reporter():
        ev.evaluate()
    n_batches = -(-len(test) // BATCH)
    assert [c.calls for c in counted] == [n + n_batches for n in calls]
    assert_same_in(data_comm, loss, 'after evaluation')


def test_update_without_lossfun_after_a_lazy_forward():
    """``update()`` after the user's own forward/backward: same rule, the forward ran once."""
    data_comm, model_comm = make_comms()
    numpy.random.seed(30 + RANK)
    model, counted = make_part(model_comm)
    opt = chainermn.create_multi_node_optimizer(chainer.optimizers.SGD(lr=0.1), data_comm)
    opt.setup(model)
    rs = numpy.random.RandomState(RANK)
    for k in range(1, 4):
        model.cleargrads()
        if model_comm.rank == 0:
            x = rs.standard_normal((BATCH, 4)).astype(numpy.float32)
            F.sum(model(x)).backward()
        else:
            model().backward()
        opt.update()
        assert [c.calls for c in counted] == [k] * len(counted)
        assert opt.t == (k if model_comm.rank == 0 else k - 1)
        assert_same_in(data_comm, model, 'after update {}'.format(k))


class Holder:
    """What a snapshot holds here: the model (first, so lazy parameters exist) and the updater."""

    def __init__(self, model, updater):
        self.model = model
        self.updater = updater

    def serialize(self, serializer):
        self.model.serialize(serializer['model'])
        self.updater.serialize(serializer['updater'])


def _training(data_comm, model_comm, seed):
    numpy.random.seed(seed + RANK)
    model, counted = make_part(model_comm)
    loss = Loss(model, model_comm.rank == 0)
    opt = chainermn.create_multi_node_optimizer(chainer.optimizers.Adam(alpha=0.01), data_comm)
    opt.setup(loss)
    train, _ = datasets(data_comm, model_comm)
    updater = training.StandardUpdater(chainer.iterators.SerialIterator(train, BATCH, shuffle=False),
                                       opt)
    return Holder(loss, updater), counted, opt


def test_resume_from_a_checkpoint_runs_the_forward_once(tmp_path):
    """After maybe_load the lazy parameters exist and are in step: the next update updates."""
    data_comm, model_comm = make_comms()
    first, _, opt = _training(data_comm, model_comm, seed=50)
    for _ in range(3):
        first.updater.update()
    t = opt.t
    cp = chainermn.create_multi_node_checkpointer('fw', COMM, path=str(tmp_path))
    cp.save(first, iteration=3)
    again, counted, opt2 = _training(data_comm, model_comm, seed=70)   # other initial values
    assert chainermn.create_multi_node_checkpointer('fw', COMM, path=str(tmp_path)).maybe_load(
        again, opt2) == 3
    assert opt2.t == t
    for name, p in again.model.namedparams():
        assert numpy.array_equal(p.array, dict(first.model.namedparams())[name].array)
    again.updater.update()
    assert [c.calls for c in counted] == [1] * len(counted)
    assert opt2.t == t + 1   # not skipped: the parameters came from the snapshot, not the forward
    assert_same_in(data_comm, again.model, 'after the update that follows the resume')
