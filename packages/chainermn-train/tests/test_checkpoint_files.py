"""Pickle-free snapshot files and checkpoint-directory warnings, in one process (no MPI)."""

import os
import sys
import warnings
import zipfile

import numpy
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), 'mpi'))
from _poison import Payload  # noqa: E402

from chainermn_train.checkpoint.read import npz  # noqa: E402
from chainermn_comm.safe_files import UntrustedPathError  # noqa: E402
from chainermn_train.checkpoint import MultiNodeCheckpointer as _Checkpointer  # noqa: E402
from chainermn_train.checkpoint import SnapshotUnusableError  # noqa: E402


def MultiNodeCheckpointer(*args, **kwargs):
    # These tests look at the disk right after each save: synchronous writes (background writes
    # are tested in test_background_checkpoint*.py).
    kwargs.setdefault('background', False)
    return _Checkpointer(*args, **kwargs)


class OneRank:
    """Stand-in communicator of a single-rank job."""

    rank = 0
    size = 1

    def allgather_obj(self, obj):
        return [obj]


def _write(path, values):
    with open(path, 'wb') as f:
        npz.write(f, values)
    return path


def test_round_trip_of_none_strings_and_arrays(tmp_path):
    values = {'a/none': None, 'b': numpy.arange(5, dtype=numpy.float16), 'c': 'log text',
              'd': 3, 'e': numpy.float64(0.1)}
    fn = _write(str(tmp_path / 's'), values)
    got, pickled = npz.read(fn)
    assert pickled == [] and sorted(got) == sorted(values)
    assert got['a/none'].dtype == object and got['a/none'][()] is None
    assert got['b'].dtype == numpy.float16 and got['b'].tobytes() == values['b'].tobytes()
    assert got['c'][()] == 'log text' and got['d'][()] == 3 and got['e'][()] == 0.1
    with zipfile.ZipFile(fn) as zf:
        assert 'a/none.npy' not in zf.namelist()


def test_values_only_pickle_could_store_are_refused_at_save(tmp_path):
    with pytest.raises(TypeError, match="'opaque'.*object array"):
        npz.to_arrays({'opaque': [object(), 1]})
    with pytest.raises(ValueError, match='reserved'):
        npz.to_arrays({npz.NONE_KEY: 1})


def test_object_members_are_refused_before_any_unpickling(tmp_path):
    marker = str(tmp_path / 'ran')
    fn = str(tmp_path / 'evil')
    numpy.savez(fn, fine=numpy.zeros(2), **{'x/y': numpy.array(Payload(marker), dtype=object)})
    with pytest.raises(npz.PickleRequired) as e:
        npz.read(fn + '.npz')
    assert e.value.keys == ['x/y'] and "'x/y'" in str(e.value) and fn in str(e.value)
    assert not os.path.exists(marker)
    npz.read(fn + '.npz', allow_pickle=True)   # the opt-in really unpickles
    assert os.path.exists(marker)


def test_malformed_files_are_unreadable(tmp_path):
    fn = str(tmp_path / 'raw')
    with zipfile.ZipFile(fn, 'w') as zf:
        zf.writestr('payload.pkl', b'x')
    with pytest.raises(ValueError, match='not a .npy array'):
        npz.read(fn)
    newer = str(tmp_path / 'newer.npz')
    numpy.savez(newer, **{npz.FORMAT_KEY: numpy.int64(npz.FORMAT_VERSION + 1)})
    with pytest.raises(ValueError, match='newer than this chainermn reads'):
        npz.read(newer)
    good = _write(str(tmp_path / 'good'), {'w': numpy.ones(1000)})
    with open(good, 'r+b') as f:
        f.truncate(os.path.getsize(good) // 2)
    with pytest.raises(Exception):
        npz.read(good)


@pytest.mark.parametrize('mode,refused', [(0o777, True), (0o1777, True), (0o757, True), (0o755, False),
                                          (0o700, False)])
def test_directory_others_can_write_is_refused_sticky_or_not(tmp_path, mode, refused, monkeypatch):
    monkeypatch.delenv('CHAINERMN_TRUST_SHARED', raising=False)
    d = tmp_path / 'cp'
    d.mkdir()
    os.chmod(str(d), mode)
    if not refused:
        MultiNodeCheckpointer('run', OneRank(), path=str(d))
        return
    with pytest.raises(UntrustedPathError) as e:
        MultiNodeCheckpointer('run', OneRank(), path=str(d))
    text = str(e.value)
    assert text.startswith('rank 0: chainermn: refusing the checkpoint directory {}'.format(d)), text
    assert 'mode {:04o}'.format(mode) in text and 'other users can write it' in text, text
    assert 'mkdir -m 700' in text and 'CHAINERMN_TRUST_SHARED=1' in text, text
    assert os.listdir(str(d)) == []   # nothing written into it
    # the opt-ins: the keyword and the variable
    MultiNodeCheckpointer('run', OneRank(), path=str(d), allow_shared=True).save({'v': numpy.zeros(1)}, 1)
    monkeypatch.setenv('CHAINERMN_TRUST_SHARED', '1')
    MultiNodeCheckpointer('run2', OneRank(), path=str(d))


@pytest.mark.skipif(not hasattr(os, 'geteuid') or os.geteuid() != 0, reason='chown needs root')
def test_directory_owned_by_someone_else_is_refused(tmp_path):
    d = tmp_path / 'theirs'
    d.mkdir()
    os.chmod(str(d), 0o755)
    os.chown(str(d), 4242, -1)
    with pytest.raises(UntrustedPathError) as e:
        MultiNodeCheckpointer('run', OneRank(), path=str(d))
    assert str(d) in str(e.value) and 'owned by another user' in str(e.value)
    assert 'uid 4242' in str(e.value) and '0755' in str(e.value)


def test_directory_made_by_the_checkpointer_is_private_even_under_umask_0(tmp_path):
    parent = tmp_path / 'p'
    parent.mkdir()
    old = os.umask(0)
    try:
        cp = MultiNodeCheckpointer('run', OneRank(), path=str(parent / 'new'))
        cp.save({'v': numpy.zeros(1)}, iteration=1)
    finally:
        os.umask(old)
    assert oct(os.stat(str(parent / 'new')).st_mode & 0o777) == oct(0o755)
    assert oct(os.stat(cp.filename(1)).st_mode & 0o777) == oct(0o644)   # never writable by others


def test_unknown_opt_in_value_is_an_error(tmp_path, monkeypatch):
    monkeypatch.setenv('CHAINERMN_ALLOW_PICKLE', 'maybe')
    cp = MultiNodeCheckpointer('run', OneRank(), path=str(tmp_path))
    with pytest.raises(ValueError, match="CHAINERMN_ALLOW_PICKLE='maybe'"):
        cp.maybe_load({'v': numpy.zeros(1)})
    monkeypatch.setenv('CHAINERMN_ALLOW_PICKLE', '0')
    assert cp.maybe_load({'v': numpy.zeros(1)}) is None


class Job:
    """What the ranks of one stand-in job agree on: the first value given to each collective call."""

    def __init__(self, size):
        self.size = size
        self.calls = {}


class Rank:
    """Stand-in communicator: one rank of ``job``; every collective returns rank 0's value (its first)."""

    def __init__(self, rank, job):
        self.rank, self.size, self.job, self.n = rank, job.size, job, 0

    def allgather_obj(self, obj):
        self.n += 1
        return [self.job.calls.setdefault(self.n, obj)] * self.size


def test_files_of_another_world_size_stay_until_a_complete_generation_of_this_size_exists(tmp_path):
    path = str(tmp_path)
    job4 = Job(4)
    for r in range(4):   # the job of 4 ranks wrote iterations 10 and 20
        old = MultiNodeCheckpointer('run', Rank(r, job4), path=path)
        old.save({'v': numpy.zeros(1)}, iteration=10)
        old.save({'v': numpy.zeros(1)}, iteration=20)
    job2 = Job(2)
    new = [MultiNodeCheckpointer('run', Rank(r, job2), path=path, cp_interval=1, gc_interval=1)
           for r in range(2)]
    assert new[0].run_id == new[1].run_id != old.run_id
    for cp in new:
        cp.run_id = old.run_id   # what maybe_load does when it reshards from the job of 4
    new[0].save({'v': numpy.ones(1)}, iteration=25)   # rank 1 has not written 25 yet
    files = set(os.listdir(path))
    assert {'run.{}.{}'.format(r, it) for r in range(4) for it in (10, 20)} <= files
    new[1].save({'v': numpy.ones(1)}, iteration=25)   # complete now: rank 1 removes its old files
    assert _snapshots(path) == ['run.0.10', 'run.0.20', 'run.0.25', 'run.1.25', 'run.2.10',
                                'run.2.20', 'run.3.10', 'run.3.20']
    new[0].save({'v': numpy.ones(1)}, iteration=30)   # rank 0 removes its own old files and ranks 2, 3
    assert _snapshots(path) == ['run.0.30', 'run.1.25']
    meta = npz.read_meta(os.path.join(path, 'run.0.30'))
    assert meta['world_size'] == 2 and meta['rank'] == 0 and meta['iteration'] == 30
    assert meta['run'] == old.run_id


def _snapshots(path):
    return sorted(n for n in os.listdir(path) if not n.startswith('.'))


def test_files_of_another_run_are_never_collected(tmp_path):
    path = str(tmp_path)
    other = MultiNodeCheckpointer('run', OneRank(), path=path)
    other.save({'v': numpy.zeros(1)}, iteration=3)
    mine = MultiNodeCheckpointer('run', OneRank(), path=path, cp_interval=1, gc_interval=1)
    assert mine.run_id != other.run_id
    for it in (5, 6, 7):
        mine.save({'v': numpy.ones(1)}, iteration=it)
    assert _snapshots(path) == ['run.0.3', 'run.0.7']
    mine.cleanup()
    assert _snapshots(path) == ['run.0.3']


def _values(value):
    import chainer
    link = chainer.links.Linear(3, 2)   # keys W (2, 3) and b (2,)
    for p in link.params():
        p.array[...] = value
    return link


def test_stray_names_are_ignored_with_one_warning_by_load_and_collection(tmp_path):
    path = str(tmp_path)
    for name in ('run.0.²', 'run.0.05', 'run.x.1', 'run.0.1.tmp'):
        (tmp_path / name).write_text('x')
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter('always')
        cp = MultiNodeCheckpointer('run', OneRank(), path=path, cp_interval=1, gc_interval=1)
        for it in (1, 2, 3):
            cp.save(_values(it), iteration=it)
        target = _values(0)
        assert MultiNodeCheckpointer('run', OneRank(), path=path).maybe_load(target) == 3
    assert target.W.array[0, 0] == 3
    texts = [str(x.message) for x in w if 'ASCII digits' in str(x.message)]
    assert len(texts) == 1 and "'run.0.²'" in texts[0] and "'run.0.05'" in texts[0], texts
    assert {'run.0.²', 'run.0.05', 'run.x.1', 'run.0.1.tmp'} <= set(os.listdir(path))


def _zip_member(path, key, header_shape, declared):
    """Rewrite ``path`` (an npz) with member ``key`` replaced by an npy header of ``header_shape``
    float64 whose zip entry says ``declared`` bytes of the real ones."""
    import io
    buf = io.BytesIO()
    numpy.lib.format.write_array_header_1_0(buf, {'descr': '<f8', 'fortran_order': False,
                                                  'shape': header_shape})
    data = buf.getvalue() + bytes(declared - len(buf.getvalue()))
    with zipfile.ZipFile(path) as zf:
        members = {n: zf.read(n) for n in zf.namelist() if n != key + '.npy'}
    with zipfile.ZipFile(path, 'w') as zf:
        for n, b in members.items():
            zf.writestr(n, b)
        zf.writestr(key + '.npy', data)


def test_members_larger_than_their_arrays_are_refused_before_reading(tmp_path):
    path = str(tmp_path)
    cp = MultiNodeCheckpointer('run', OneRank(), path=path)
    cp.save(_values(1), iteration=1)
    cp.save(_values(2), iteration=2)
    # a member far larger than the (2, 3) array it fills
    _zip_member(cp.filename(2), 'W', (1 << 20,), 128 + (8 << 20))
    with pytest.raises(npz.MemberTooLarge, match="member 'W' declares 8388736 bytes"):
        npz.read(cp.filename(2), limits={'W': npz.member_limit((2, 3))})
    target = _values(0)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter('always')
        assert MultiNodeCheckpointer('run', OneRank(), path=path).maybe_load(target) == 1
    assert target.W.array[0, 0] == 1
    assert any("member 'W' declares" in str(x.message) for x in w), [str(x.message) for x in w]
    # a header that says more than its entry holds
    _zip_member(cp.filename(2), 'W', (1 << 30,), 256)
    with pytest.raises(npz.MemberTooLarge, match='says it holds'):
        npz.read(cp.filename(2), limits={'W': npz.member_limit((2, 3))})


def test_a_file_that_contradicts_its_name_is_not_loaded(tmp_path):
    path = str(tmp_path)
    cp = MultiNodeCheckpointer('run', OneRank(), path=path)
    cp.save(_values(5), iteration=5)
    cp.save(_values(20), iteration=20)
    os.rename(cp.filename(20), cp.filename(1000))
    target = _values(0)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter('always')
        assert MultiNodeCheckpointer('run', OneRank(), path=path).maybe_load(target) == 5
    assert target.W.array[0, 0] == 5
    assert any('records iteration 20 but its name says 1000' in str(x.message) for x in w)


def _trainer_of(optimizer, value, out):
    import chainer
    model = chainer.links.Linear(3, 2)
    for p in model.params():
        p.array[...] = value
    optimizer.setup(model)
    it = chainer.iterators.SerialIterator([(numpy.ones(3, numpy.float32),)], 1)
    updater = chainer.training.StandardUpdater(
        it, optimizer, loss_func=lambda x: chainer.functions.sum(model(x)))
    return chainer.training.Trainer(updater, (1, 'iteration'), out=out), model


def test_another_optimizer_is_refused_naming_both_and_weights_only_loads_the_model(tmp_path):
    import chainer
    path = str(tmp_path)
    adam, adam_model = _trainer_of(chainer.optimizers.Adam(), 1.0, str(tmp_path / 'out'))
    adam.run()
    MultiNodeCheckpointer('run', OneRank(), path=path).save(adam)
    sgd, sgd_model = _trainer_of(chainer.optimizers.MomentumSGD(), 7.0, str(tmp_path / 'out'))
    cp = MultiNodeCheckpointer('run', OneRank(), path=path)
    with pytest.raises(SnapshotUnusableError) as e:
        cp.maybe_load(sgd)
    text = str(e.value)
    assert 'chainer.optimizers.adam.Adam (state: m,v)' in text, text
    assert "this job's is chainer.optimizers.momentum_sgd.MomentumSGD (state: v)" in text, text
    assert 'weights_only=True' in text and float(sgd_model.W.array[0, 0]) == 7.0
    assert cp.maybe_load(sgd, weights_only=True) == 1
    assert numpy.array_equal(sgd_model.W.array, adam_model.W.array)
    assert sgd.updater.iteration == 0 and sgd_model.W.update_rule.state is None
    assert cp.run_id != npz.read_meta(cp.filename(1))['run']   # a new run, not the Adam one


def test_members_of_unknown_size_are_bounded_only_when_inflated(tmp_path, monkeypatch):
    import chainer
    monkeypatch.setattr(npz, 'UNKNOWN_MEMBER_BYTES', 1000)
    path = str(tmp_path)
    saved = chainer.links.Linear(50, 20)          # W: 4000 bytes, more than the bound above
    cp = MultiNodeCheckpointer('run', OneRank(), path=path)
    cp.save(saved, iteration=1)
    lazy = chainer.links.Linear(None, 20)         # W not initialized: its shape is unknown
    assert MultiNodeCheckpointer('run', OneRank(), path=path).maybe_load(lazy) == 1   # stored: fine
    assert numpy.array_equal(lazy.W.array, saved.W.array)
    compressed = str(tmp_path / 'compressed.npz')
    chainer.serializers.save_npz(compressed, saved, compression=True)
    with pytest.raises(npz.MemberTooLarge, match='compressed members whose size'):
        npz.read(compressed, limits={'b': npz.member_limit((20,))})
    # a stored member must declare what it stores
    with zipfile.ZipFile(cp.filename(1)) as zf:
        members = {n: zf.read(n) for n in zf.namelist()}
    forged = str(tmp_path / 'forged.npz')
    with zipfile.ZipFile(forged, 'w') as zf:
        for n, data in members.items():
            zf.writestr(n, data)
    with open(forged, 'r+b') as f:   # the central directory's uncompressed size of the last member
        raw = f.read()
        at = raw.rindex(b'PK\x01\x02')
        f.seek(at + 24)
        f.write((len(members[n]) + 1).to_bytes(4, 'little'))
    with pytest.raises(npz.MemberTooLarge, match='is stored with'):
        npz.read(forged)


def test_the_writer_thread_yields_to_training_until_training_waits_for_it():
    import threading
    from chainermn_train.checkpoint.write import background
    flight = background.InFlight()
    seen = []

    class File:
        def write(self, data):
            seen.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))
            return len(data)

    def write():
        f = flight.file(File())
        f.write(b'while training runs')
        while not flight._hurry:   # until the rank waits for the write
            threading.Event().wait(0.01)
        f.write(b'while training waits')
        return 2

    base = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    flight.start(1, write)
    outcome = flight.wait(60)
    assert outcome.ok and outcome.size == 2
    assert seen[0] == min(19, base + background.WRITER_NICENESS), seen
    if os.geteuid() == 0:   # raising a priority again needs the privilege
        assert seen[1] == base, seen
