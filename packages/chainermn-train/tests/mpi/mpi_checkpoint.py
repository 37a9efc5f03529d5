"""Pickle-free checkpoints on every rank (run under mpiexec): round trip, poisoned files, opt-in."""

import os
import sys
import warnings
import zipfile

import chainer
import chainer.functions as F
import chainer.links as L
import numpy
import pytest
from chainermn_comm.testing import shared_tmpdir

sys.path.insert(0, os.path.dirname(__file__))
import _common  # noqa: E402
import _poison  # noqa: E402

import chainermn_train  # noqa: E402
from chainermn_train.checkpoint import CheckpointWarning, UnsafeCheckpointError  # noqa: E402
from chainermn_train.checkpoint.ownership import trust as checkpoint_trust  # noqa: E402
from chainermn_train.checkpoint.read import npz as checkpoint_npz  # noqa: E402


def _checkpointer(*args, **kwargs):
    # These tests read the files right after each save: synchronous writes (background writes are
    # tested in mpi_background_checkpoint.py).
    kwargs.setdefault('background', False)
    return chainermn_train.create_multi_node_checkpointer(*args, **kwargs)

ENV = 'CHAINERMN_ALLOW_PICKLE'


@pytest.fixture(autouse=True)
def _fresh_opt_in_state(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.setattr(checkpoint_trust, '_pickle_warned', False)


def _shared_tmpdir(comm):
    return shared_tmpdir(comm, 'cmn_ckpt_')


# -- a trainer whose state holds None values, optimizer state and averaged persistents -------------
class NoneHolder(chainer.training.Extension):
    """Extension with state that stays None (and a counter that does not)."""

    def __init__(self):
        self.best = None
        self.calls = 0

    def __call__(self, trainer):
        self.calls += 1

    def serialize(self, serializer):
        self.best = serializer('best', self.best)
        self.calls = serializer('calls', self.calls)


class Updater(chainer.training.updaters.StandardUpdater):
    """Standard updater with a state value that is None."""

    last_note = None

    def serialize(self, serializer):
        super().serialize(serializer)
        self.last_note = serializer('last_note', self.last_note)


def _trainer(comm, seed, stop):
    chainer.global_config.dtype = numpy.dtype(numpy.float64)
    numpy.random.seed(seed)
    model = chainer.Sequential(L.Linear(4, 6), L.BatchNormalization(6), F.tanh, L.Linear(6, 3))
    x, y = _common.data(8 * comm.size, seed=7)
    train = list(zip(x[comm.rank::comm.size] + comm.rank, y[comm.rank::comm.size]))
    opt = chainermn_train.create_multi_node_optimizer(chainer.optimizers.Adam(alpha=0.01), comm)
    opt.setup(model)
    it = chainer.iterators.SerialIterator(train, 2, shuffle=False)
    updater = Updater(it, opt, converter=chainer.dataset.concat_examples,
                      loss_func=lambda xb, yb: F.mean_squared_error(model(xb), yb))
    trainer = chainer.training.Trainer(updater, (stop, 'iteration'), out=_shared_tmpdir(comm))
    trainer.extend(chainermn_train.extensions.AllreducePersistent(model, comm), trigger=(2, 'iteration'))
    # Chainer's own None: the best value of a MinValueTrigger that has not fired yet
    trainer.extend(NoneHolder(), name='holder',
                   trigger=chainer.training.triggers.MinValueTrigger('main/loss', (1000, 'iteration')))
    return trainer, model


def _state(trainer):
    """Every value a snapshot of ``trainer`` holds (elapsed time frozen at the loaded value)."""
    if not trainer._done and trainer._start_at is None:
        trainer._done, trainer._final_elapsed_time = True, trainer._snapshot_elapsed_time
    s = chainer.serializers.DictionarySerializer()
    s.save(trainer)
    return {k: numpy.asanyarray(v) for k, v in s.target.items()}


def _assert_bitwise(want, got, what):
    assert sorted(want) == sorted(got), what
    for k in want:
        a, b = want[k], got[k]
        if a.dtype.hasobject:
            assert a.shape == () and a[()] is None and b.dtype.hasobject and b[()] is None, (what, k)
            continue
        assert (a.dtype, a.shape) == (b.dtype, b.shape), (what, k, a.dtype, b.dtype)
        assert a.tobytes() == b.tobytes(), (what, k)


def test_trainer_round_trip_is_bitwise_with_none_values():
    comm = _common.comm()
    trainer, model = _trainer(comm, seed=1, stop=4)
    trainer.run()
    path = _shared_tmpdir(comm)
    cp = _checkpointer('rt', comm, path=path)
    fn = cp.save(trainer)
    assert fn == cp.filename(4)
    want = _state(trainer)
    nones = sorted(k for k, v in want.items() if v.dtype.hasobject)
    assert 'extensions/holder/best' in nones and 'updater/last_note' in nones, nones
    assert 'extension_triggers/holder/best_value' in nones, nones
    assert any(k.endswith('/m') for k in want) and any(k.endswith('/avg_mean') for k in want)

    # the file holds no object array: NumPy itself loads it without pickle
    with numpy.load(fn, allow_pickle=False) as npz:
        stored = {k: npz[k] for k in npz.files}
    assert sorted(stored[checkpoint_npz.NONE_KEY].tolist()) == nones
    assert not any(v.dtype.hasobject for v in stored.values())

    fresh, fresh_model = _trainer(comm, seed=2, stop=4)
    cp2 = _checkpointer('rt', comm, path=path)
    with warnings.catch_warnings():
        warnings.simplefilter('error', CheckpointWarning)
        assert cp2.maybe_load(fresh, fresh.updater.get_optimizer('main')) == 4
    assert fresh.updater.last_note is None and fresh.get_extension('holder').best is None
    assert fresh.get_extension('holder').calls == 0 and fresh.updater.iteration == 4
    got = _state(fresh)
    _assert_bitwise(want, got, 'state after load')
    # persistents were averaged over the ranks, so they are equal everywhere after the load
    for a in comm.allgather(fresh_model[1].avg_mean):
        assert a.tobytes() == fresh_model[1].avg_mean.tobytes()

    # and saving the loaded trainer again writes the same arrays
    again = _shared_tmpdir(comm)
    fn2 = _checkpointer('rt', comm, path=again).save(fresh)
    first, second = checkpoint_npz.read(fn)[0], checkpoint_npz.read(fn2)[0]
    run = checkpoint_npz.META_PREFIX + 'run'
    assert first.pop(run)[()] == cp.run_id and second.pop(run)[()] != cp.run_id   # another run
    _assert_bitwise(first, second, 'file written after load')


# -- poisoned snapshots --------------------------------------------------------------------------
def _poison_file(fn, marker):
    """Replace the snapshot ``fn`` by an npz with the same keys, each a pickled payload."""
    with zipfile.ZipFile(fn) as zf:
        keys = [n[:-4] for n in zf.namelist()]
    with open(fn, 'wb') as f:
        numpy.savez(f, **{k: numpy.array(_poison.Payload(marker), dtype=object) for k in keys})


def _model_snapshots(comm, path, iterations):
    cp = _checkpointer('p', comm, path=path)
    model = _common.make_model(3)
    for it in iterations:
        for p in model.params():
            p.array[...] = it + comm.rank
        cp.save(model, iteration=it)
    return cp


def test_the_payload_runs_code_when_unpickled(tmp_path):
    marker, fn = str(tmp_path / 'ran'), str(tmp_path / 'probe.npz')
    numpy.savez(fn, a=numpy.array(_poison.Payload(marker), dtype=object))
    with numpy.load(fn, allow_pickle=True) as npz:
        npz['a']
    assert os.path.exists(marker)   # so the tests below would see code that ran


@pytest.mark.parametrize('who', ['every rank', 'last rank'])
def test_poisoned_newest_generation_falls_back_without_running_code(who):
    comm = _common.comm()
    path = _shared_tmpdir(comm)
    marker = os.path.join(path, 'code-ran')
    cp = _model_snapshots(comm, path, [1, 2, 3])
    if who == 'every rank' or comm.rank == comm.size - 1:
        _poison_file(cp.filename(3), marker)
    comm.mpi_comm.Barrier()
    fresh = _common.make_model(4)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter('always')
        got = _checkpointer('p', comm, path=path).maybe_load(fresh)
    comm.mpi_comm.Barrier()
    assert not os.path.exists(marker)
    assert got == 2
    assert all(numpy.all(p.array == 2 + comm.rank) for p in fresh.params())
    texts = [str(x.message) for x in w if issubclass(x.category, CheckpointWarning)]
    refused = cp.filename(3, comm.size - 1)
    if comm.rank == 0:   # one warning for the job, shown by rank 0
        assert any(refused in t and 'refused' in t and ENV in t for t in texts), texts
    else:
        assert not any('cannot use the snapshots' in t for t in texts), texts


def test_every_generation_poisoned_is_an_error_and_runs_no_code():
    comm = _common.comm()
    path = _shared_tmpdir(comm)
    marker = os.path.join(path, 'code-ran')
    cp = _model_snapshots(comm, path, [1, 2])
    for it in (1, 2):
        _poison_file(cp.filename(it), marker)
    comm.mpi_comm.Barrier()
    fresh = _common.make_model(4)
    before = _common.params_of(fresh)
    with warnings.catch_warnings():
        warnings.simplefilter('ignore', CheckpointWarning)
        with pytest.raises(UnsafeCheckpointError) as e:
            _checkpointer('p', comm, path=path).maybe_load(fresh)
    comm.mpi_comm.Barrier()
    assert not os.path.exists(marker)
    msg = str(e.value)
    assert cp.filename(2) in msg and cp.filename(1) in msg and 'needs pickle' in msg, msg
    assert ENV + '=1' in msg and 'allow_pickle=True' in msg, msg
    after = _common.params_of(fresh)
    assert all(numpy.array_equal(before[k], after[k]) for k in before)


# -- the opt-in for trusted old-format files ----------------------------------------------------
def _old_format_snapshot(comm, path):
    """Write what the checkpointer wrote before pickle-free snapshots: Chainer's save_npz."""
    model = _common.make_model(5)
    model.add_persistent('note', None)
    for p in model.params():
        p.array[...] = 7 + comm.rank
    cp = _checkpointer('old', comm, path=path)
    chainer.serializers.save_npz(cp.filename(6), model, compression=False)
    comm.mpi_comm.Barrier()
    return cp.filename(6)


def _target():
    model = _common.make_model(6)
    model.add_persistent('note', 'not None yet')
    return model


def _pickle_warnings(w):
    return [str(x.message) for x in w
            if issubclass(x.category, CheckpointWarning) and 'unpickled' in str(x.message)]


def test_old_format_is_refused_without_opt_in():
    comm = _common.comm()
    path = _shared_tmpdir(comm)
    fn = _old_format_snapshot(comm, path)
    with warnings.catch_warnings():
        warnings.simplefilter('ignore', CheckpointWarning)
        with pytest.raises(UnsafeCheckpointError, match="'note'") as e:
            _checkpointer('old', comm, path=path).maybe_load(_target())
    assert fn in str(e.value)


@pytest.mark.parametrize('how', ['maybe_load', 'create', 'env'])
def test_opt_in_loads_old_format_and_warns_once(how, monkeypatch):
    comm = _common.comm()
    path = _shared_tmpdir(comm)
    fn = _old_format_snapshot(comm, path)
    if how == 'env':
        monkeypatch.setenv(ENV, '1')
    cp = _checkpointer('old', comm, path=path,
                                                        allow_pickle=True if how == 'create' else None)
    kwargs = {'allow_pickle': True} if how == 'maybe_load' else {}
    for attempt in range(2):
        target = _target()
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter('always')
            assert cp.maybe_load(target, **kwargs) == 6
        assert target.note is None
        assert all(numpy.all(p.array == 7 + comm.rank) for p in target.params())
        texts = _pickle_warnings(w)
        if attempt == 0:
            assert len(texts) == 1 and fn in texts[0] and "'note'" in texts[0], texts
            assert (ENV in texts[0]) == (how == 'env'), texts
        else:
            assert texts == []   # once per process


def test_explicit_false_overrides_the_environment(monkeypatch):
    comm = _common.comm()
    path = _shared_tmpdir(comm)
    _old_format_snapshot(comm, path)
    monkeypatch.setenv(ENV, '1')
    cp = _checkpointer('old', comm, path=path)
    with warnings.catch_warnings():
        warnings.simplefilter('ignore', CheckpointWarning)
        with pytest.raises(UnsafeCheckpointError):
            cp.maybe_load(_target(), allow_pickle=False)
