"""Ordinary mistakes caught on every rank: a plain optimizer, different batch sizes (run under mpiexec)."""

import json
import os
import sys
import warnings

import chainer
import chainer.links as L
import numpy
import pytest
from chainer.training import extensions

sys.path.insert(0, os.path.dirname(__file__))
import _common  # noqa: E402

import chainermn_train  # noqa: E402
from chainermn_comm import launch_status, protocol  # noqa: E402
from chainermn_comm.testing import shared_tmpdir  # noqa: E402
from chainermn_train import _fingerprint  # noqa: E402

HINT = 'chainermn.create_multi_node_optimizer(optimizer, comm)'


@pytest.fixture(autouse=True)
def _warn_again(monkeypatch):
    monkeypatch.setattr(_fingerprint, '_warned', False)


def _classifier(seed):
    numpy.random.seed(seed)   # the same initial parameters on every rank
    return L.Classifier(_common.MLP(4, 5, 3))


def _rank_data(comm, n=24):
    rs = numpy.random.RandomState(100 + comm.rank)   # each rank its own examples
    x = rs.standard_normal((n, 4)).astype(numpy.float32)
    t = rs.randint(0, 3, n).astype(numpy.int32)
    return chainer.datasets.TupleDataset(x, t)


def _updater(comm, model, multi_node, batch_size=4):
    opt = chainer.optimizers.SGD(lr=0.1)
    if multi_node:
        opt = chainermn_train.create_multi_node_optimizer(opt, comm)
    opt.setup(model)
    it = chainer.iterators.SerialIterator(_rank_data(comm), batch_size, shuffle=False)
    return chainer.training.updaters.StandardUpdater(it, opt)


def _evaluator(comm, model):
    it = chainer.iterators.SerialIterator(_rank_data(comm, 8), 4, repeat=False, shuffle=False)
    return chainermn_train.create_multi_node_evaluator(extensions.Evaluator(it, model), comm)


def _mismatch_warnings(record):
    return [str(w.message) for w in record if issubclass(w.category, chainermn_train.ParameterMismatchWarning)]


@pytest.fixture
def float32():
    with chainer.using_config('dtype', numpy.float32):
        yield


def test_plain_optimizer_is_noticed_by_the_evaluator_once(float32):
    comm = _common.comm()
    model = _classifier(0)
    updater = _updater(comm, model, multi_node=False)
    for _ in range(3):
        updater.update()
    ev = _evaluator(comm, model)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter('always')
        ev()
        ev()   # every rank takes part again; nobody warns twice
    got = _mismatch_warnings(record)
    if comm.size == 1 or comm.rank != 0:
        assert got == []
        return
    assert len(got) == 1, got
    assert 'parameter /predictor/l1/W first differs' in got[0], got[0]
    assert HINT in got[0] and 'the multi-node evaluator' in got[0], got[0]
    assert 'the {} ranks hold different values'.format(comm.size) in got[0], got[0]


def test_multi_node_optimizer_is_not_warned_about(float32):
    comm = _common.comm()
    model = _classifier(comm.rank)   # even different initial values: setup broadcasts rank 0's
    updater = _updater(comm, model, multi_node=True)
    for _ in range(3):
        updater.update()
    path = shared_tmpdir(comm, 'cmn_mistakes_')
    trainer = chainer.training.Trainer(updater, (6, 'iteration'), out=path)
    ckpt = chainermn_train.create_multi_node_checkpointer('job', comm, path=path)
    trainer.extend(ckpt, trigger=(2, 'iteration'))
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter('always')
        assert _fingerprint.check_same_parameters(comm, model, 'a test') is None
        _evaluator(comm, model)()
        trainer.run()
    assert _mismatch_warnings(record) == []


def test_plain_optimizer_is_noticed_by_the_checkpointer(float32):
    comm = _common.comm()
    model = _classifier(0)
    updater = _updater(comm, model, multi_node=False)
    path = shared_tmpdir(comm, 'cmn_mistakes_')
    trainer = chainer.training.Trainer(updater, (4, 'iteration'), out=path)
    ckpt = chainermn_train.create_multi_node_checkpointer('job', comm, path=path)
    trainer.extend(ckpt, trigger=(2, 'iteration'))
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter('always')
        trainer.run()
    got = _mismatch_warnings(record)
    if comm.size == 1 or comm.rank != 0:
        assert got == []
        return
    assert len(got) == 1 and 'parameter /predictor/l1/W first differs' in got[0], got
    assert HINT in got[0] and 'the checkpointer' in got[0], got[0]


def test_ranks_with_different_parameters_are_not_compared(float32):
    comm = _common.comm()
    numpy.random.seed(comm.rank)
    part = L.Linear(4, 2 + comm.rank)   # model parallelism: each rank its own part
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter('always')
        assert _fingerprint.check_same_parameters(comm, part, 'a test') is None
    assert _mismatch_warnings(record) == []


def test_only_the_given_communicator_is_compared(float32):
    comm = _common.comm()
    sub = comm.split(comm.rank % 2, comm.rank)   # ranks 0 and 2 share a model, rank 1 its own
    numpy.random.seed(comm.rank % 2)
    model = L.Linear(4, 2)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter('always')
        assert _fingerprint.check_same_parameters(sub, model, 'a test') is None
    assert _mismatch_warnings(record) == []


def test_different_batch_sizes_are_reported_at_the_first_update(float32):
    comm = _common.comm()
    model = _classifier(0)
    updater = _updater(comm, model, multi_node=True, batch_size=4 + comm.rank)
    before = {k: p.array.copy() for k, p in model.namedparams()}
    if comm.size == 1:
        updater.update()
        return
    with pytest.raises(ValueError) as e:
        updater.update()
    msg = str(e.value)
    sizes = ', '.join('rank {}: {}'.format(r, 4 + r) for r in range(comm.size))
    assert 'rank {}: the ranks'.format(comm.rank) in msg and 'first update ({})'.format(sizes) in msg, msg
    assert 'same batch_size' in msg, msg
    for k, p in model.namedparams():   # nothing was applied
        numpy.testing.assert_array_equal(p.array, before[k])


def test_equal_batch_sizes_train_on(float32):
    comm = _common.comm()
    model = _classifier(0)
    updater = _updater(comm, model, multi_node=True, batch_size=4)
    for _ in range(2):
        updater.update()
    assert updater.iteration == 2


def test_launch_status_file(float32, monkeypatch):
    comm = _common.comm()
    path = shared_tmpdir(comm, 'cmn_status_')
    status = os.path.join(path, 'status.json')
    monkeypatch.setenv(protocol.LAUNCH_STATUS_ENV, status)
    for run, stop, generation in ((1, 3, None), (2, 5, 3)):
        model = _classifier(0)
        updater = _updater(comm, model, multi_node=True)
        trainer = chainer.training.Trainer(updater, (stop, 'iteration'), out=path)
        # Synchronous: the first run's finalize is skipped below, so no write may be left in flight.
        ckpt = chainermn_train.create_multi_node_checkpointer('job', comm, path=path, background=False)
        trainer.extend(ckpt, trigger=(1, 'iteration'))
        assert ckpt.maybe_load(trainer, updater.get_optimizer('main')) == generation
        if comm.rank == 0:
            assert launch_status.read_launch_status(status) == {'generation': generation}
        comm.mpi_comm.Barrier()
        if run == 1:
            ckpt.finalize = lambda: None   # keep the snapshots for the second run
        trainer.run()
        comm.mpi_comm.Barrier()
        got = launch_status.read_launch_status(status)
        assert sorted(got) == ['first_iteration_wall', 'generation', 'iteration'], got
        assert got['generation'] == generation and got['iteration'] == stop, got
        assert isinstance(got['first_iteration_wall'], float), got
        with open(status) as f:
            json.load(f)
        comm.mpi_comm.Barrier()
        if comm.rank == 0:
            os.remove(status)
        comm.mpi_comm.Barrier()
    assert not any(fn.startswith('status.json.') for fn in os.listdir(path))
