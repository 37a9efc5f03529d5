"""Pickle-free snapshot files and checkpoint-directory warnings, in one process (no MPI)."""

import os
import sys
import warnings
import zipfile

import numpy
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), 'mpi'))
from _poison import Payload  # noqa: E402

from chainermn_train.checkpoint import _safe_npz  # noqa: E402
from chainermn_comm.safe_files import UntrustedPathError  # noqa: E402
from chainermn_train.checkpoint import MultiNodeCheckpointer  # noqa: E402


class OneRank:
    """Stand-in communicator of a single-rank job."""

    rank = 0
    size = 1

    def allgather_obj(self, obj):
        return [obj]


def _write(path, values):
    with open(path, 'wb') as f:
        _safe_npz.write(f, values)
    return path


def test_round_trip_of_none_strings_and_arrays(tmp_path):
    values = {'a/none': None, 'b': numpy.arange(5, dtype=numpy.float16), 'c': 'log text',
              'd': 3, 'e': numpy.float64(0.1)}
    fn = _write(str(tmp_path / 's'), values)
    got, pickled = _safe_npz.read(fn)
    assert pickled == [] and sorted(got) == sorted(values)
    assert got['a/none'].dtype == object and got['a/none'][()] is None
    assert got['b'].dtype == numpy.float16 and got['b'].tobytes() == values['b'].tobytes()
    assert got['c'][()] == 'log text' and got['d'][()] == 3 and got['e'][()] == 0.1
    with zipfile.ZipFile(fn) as zf:
        assert 'a/none.npy' not in zf.namelist()


def test_values_only_pickle_could_store_are_refused_at_save(tmp_path):
    with pytest.raises(TypeError, match="'opaque'.*object array"):
        _safe_npz.to_arrays({'opaque': [object(), 1]})
    with pytest.raises(ValueError, match='reserved'):
        _safe_npz.to_arrays({_safe_npz.NONE_KEY: 1})


def test_object_members_are_refused_before_any_unpickling(tmp_path):
    marker = str(tmp_path / 'ran')
    fn = str(tmp_path / 'evil')
    numpy.savez(fn, fine=numpy.zeros(2), **{'x/y': numpy.array(Payload(marker), dtype=object)})
    with pytest.raises(_safe_npz.PickleRequired) as e:
        _safe_npz.read(fn + '.npz')
    assert e.value.keys == ['x/y'] and "'x/y'" in str(e.value) and fn in str(e.value)
    assert not os.path.exists(marker)
    _safe_npz.read(fn + '.npz', allow_pickle=True)   # the opt-in really unpickles
    assert os.path.exists(marker)


def test_malformed_files_are_unreadable(tmp_path):
    fn = str(tmp_path / 'raw')
    with zipfile.ZipFile(fn, 'w') as zf:
        zf.writestr('payload.pkl', b'x')
    with pytest.raises(ValueError, match='not a .npy array'):
        _safe_npz.read(fn)
    newer = str(tmp_path / 'newer.npz')
    numpy.savez(newer, **{_safe_npz.FORMAT_KEY: numpy.int64(_safe_npz.FORMAT_VERSION + 1)})
    with pytest.raises(ValueError, match='newer than this chainermn reads'):
        _safe_npz.read(newer)
    good = _write(str(tmp_path / 'good'), {'w': numpy.ones(1000)})
    with open(good, 'r+b') as f:
        f.truncate(os.path.getsize(good) // 2)
    with pytest.raises(Exception):
        _safe_npz.read(good)


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
    meta = _safe_npz.read_meta(os.path.join(path, 'run.0.30'))
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
