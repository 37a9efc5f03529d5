"""In one process: the folders a checkpointer made are removed when empty; the shards' facts compared."""

import json
import os
import warnings

import pytest

from chainermn_comm import run_facts, safe_files
from chainermn_train.checkpoint import CheckpointWarning
from chainermn_train.checkpoint.ownership import made as made_dirs
from chainermn_train.checkpoint.read import data_order


def _make(tmp_path, *parts):
    path = str(tmp_path.joinpath(*parts))
    made = safe_files.make_directory(path, 'checkpoint directory')
    return path, made


def test_make_directory_says_what_it_made(tmp_path):
    path, made = _make(tmp_path, 'out', 'checkpoints')
    assert made == [str(tmp_path / 'out'), path]
    assert safe_files.make_directory(path) == []


def test_the_last_rank_removes_the_folders_made_when_only_records_are_left(tmp_path):
    path, made = _make(tmp_path, 'out', 'checkpoints')
    made_dirs.record(path, 'run', 1, made[:1])     # rank 1 made out, rank 2 made out/checkpoints
    made_dirs.record(path, 'run', 2, made[1:])
    with open(os.path.join(path, '.run.2.owner'), 'w') as f:   # rank 2 still holds the folder
        f.write('{}')
    made_dirs.remove_if_empty(path, 'run')
    assert sorted(os.listdir(path)) == ['.run.1.made', '.run.2.made', '.run.2.owner']
    os.unlink(os.path.join(path, '.run.2.owner'))
    made_dirs.remove_if_empty(path, 'run')
    assert not os.path.exists(str(tmp_path / 'out')) and os.path.isdir(str(tmp_path))


def test_a_parent_with_other_files_stays_and_a_folder_without_records_too(tmp_path):
    path, made = _make(tmp_path, 'out', 'checkpoints')
    made_dirs.record(path, 'run', 0, made)
    (tmp_path / 'out' / 'log').write_text('x')   # the trainer's report
    made_dirs.remove_if_empty(path, 'run')
    assert os.listdir(str(tmp_path / 'out')) == ['log']
    # A folder the user made has no record: never removed.
    mine = tmp_path / 'mine'
    mine.mkdir()
    made_dirs.remove_if_empty(str(mine), 'run')
    assert mine.is_dir()
    # Another checkpointer's files (or records) keep it too.
    path, made = _make(tmp_path, 'shared')
    made_dirs.record(path, 'run', 0, made)
    (tmp_path / 'shared' / 'other.0.5').write_text('x')
    made_dirs.remove_if_empty(path, 'run')
    assert sorted(os.listdir(path)) == ['.run.0.made', 'other.0.5']


def test_nothing_is_removed_through_a_link(tmp_path):
    path, made = _make(tmp_path, 'out', 'checkpoints')
    made_dirs.record(path, 'run', 0, made)
    records = os.path.join(path, '.run.0.made')
    with open(records) as f:
        entries = json.load(f)
    # The recorded parent is replaced by a link to another folder with an empty 'checkpoints'.
    other = tmp_path / 'other'
    (other / 'checkpoints').mkdir(parents=True)
    moved = tmp_path / 'moved'
    os.rename(str(tmp_path / 'out'), str(moved))
    os.symlink(str(other), str(tmp_path / 'out'))
    for e in entries:
        made_dirs._rmdir(e)
    assert os.path.isdir(str(other / 'checkpoints')) and os.path.islink(str(tmp_path / 'out'))
    # ... and the recorded ones, back in place, are removed.
    os.unlink(str(tmp_path / 'out'))
    os.rename(str(moved), str(tmp_path / 'out'))
    os.unlink(records)
    for e in reversed(entries):
        made_dirs._rmdir(e)
    assert not os.path.exists(str(tmp_path / 'out'))


@pytest.fixture
def facts():
    run_facts.clear(run_facts.SCATTER)
    yield
    run_facts.clear(run_facts.SCATTER)


def _files(meta):
    return {0: [(0, meta)], 1: [(1, ('unreadable', 'x'))]}


def test_unseeded_shuffle_warns_on_resume_and_a_seed_does_not(facts):
    run_facts.note(run_facts.SCATTER, {'n': 9, 'shuffle': True, 'seeded': True, 'seed': 0, 'order': 11})
    run_facts.note(run_facts.SCATTER, {'n': 3, 'shuffle': False, 'seeded': False, 'seed': None,
                                       'order': None})
    written = data_order.meta()
    assert json.loads(written[data_order.META_KEY])[0]['seed'] == 0
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        assert data_order.check(_files(written), 0, 'mnist') == []     # the same facts: nothing said
    run_facts.clear(run_facts.SCATTER)
    run_facts.note(run_facts.SCATTER, {'n': 9, 'shuffle': True, 'seeded': False, 'seed': None,
                                       'order': 12})
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter('always')
        found = data_order.check(_files(written), 0, 'mnist')
    assert [n for n, _, _ in found] == [1]
    (text,) = [str(x.message) for x in w if issubclass(x.category, CheckpointWarning)]
    assert 'call 1 (9 samples, shuffle=True, seed=None' in text and "snapshot's run: 9 samples, " \
        'shuffle=True, seed=0' in text, text
    assert 'scatter_dataset(..., shuffle=True, seed=0)' in text, text
    # Other ranks warn too (an 'error' filter raises there) but do not show it.
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter('always')
        data_order.check(_files(written), 2, 'mnist')
    assert w == []


def test_unseeded_shuffle_warns_even_without_a_record(facts):
    run_facts.note(run_facts.SCATTER, {'n': 9, 'shuffle': True, 'seeded': False, 'seed': None,
                                       'order': 12})
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter('always')
        assert len(data_order.check(_files({'world_size': 2}), 0, 'mnist')) == 1
    assert 'pass the same seed on every run' in str(w[-1].message)
    run_facts.clear(run_facts.SCATTER)
    run_facts.note(run_facts.SCATTER, {'n': 9, 'shuffle': True, 'seeded': True, 'seed': 3, 'order': 1})
    assert data_order.check(_files({'world_size': 2}), 0, 'mnist') == []   # seeded: nothing to compare
