"""Errors only one rank meets raise on that rank, never as a collective the others do not call.

Run on every rank by test_one_rank_errors_mpi.py. After each one-rank error every rank makes the
same collective call: had the failing rank started a collective of its own (``fail_together``),
the ranks would disagree on that call (CommunicationError everywhere) or wait for each other.
"""

import os
import shutil
import tempfile
import warnings
from unittest import mock

import chainer
import numpy
import pytest
from chainer.training import extensions as chainer_extensions

import chainermn_comm
from chainermn_comm.testing import shared_tmpdir
from chainermn_train import create_multi_node_checkpointer
from chainermn_train.extensions import multi_node_snapshot


@pytest.fixture(scope='module')
def comm():
    return chainermn_comm.create_communicator('naive')


@pytest.fixture
def private_cwd(monkeypatch):
    here = tempfile.mkdtemp(prefix='one-rank-cwd-')
    monkeypatch.chdir(here)
    yield here
    shutil.rmtree(here, ignore_errors=True)


def _all_ranks_still_in_step(comm):
    assert comm.allreduce_obj(1) == comm.size
    assert comm.allgather_obj(comm.rank) == list(range(comm.size))


def test_v7_smoke_multinode_snapshot_with_a_mock_trainer(comm, private_cwd):
    # Chainer v7's extensions_tests/test_multi_node_snapshot.py::test_smoke_multinode_snapshot:
    # a mock trainer (its ``out`` a mock too), a mock condition and a mock writer.
    target = mock.MagicMock()
    condition = mock.MagicMock(side_effect=[True, False])
    writer = mock.MagicMock()
    snapshot = chainer_extensions.snapshot(target=target, condition=condition, writer=writer)
    trainer = mock.MagicMock()
    ext = multi_node_snapshot(comm, snapshot, [])
    ext.initialize(trainer)
    ext(trainer)
    ext(trainer)
    ext.finalize()
    if comm.rank == 0:
        assert ext.is_master
        assert (condition.call_count, writer.call_count) == (2, 1)
    else:
        assert not ext.is_master
        assert (condition.call_count, writer.call_count) == (0, 0)
    assert os.listdir(private_cwd) == []   # nothing was made from the mock's path
    _all_ranks_still_in_step(comm)


def test_v7_smoke_with_a_trainer_out_that_cannot_be_made(comm, private_cwd):
    # The same where the mock trainer's ``out`` cannot be made (a path below a regular file).
    blocker = os.path.join(private_cwd, 'file')
    open(blocker, 'w').close()
    condition = mock.MagicMock(side_effect=[True, False])
    writer = mock.MagicMock()
    snapshot = chainer_extensions.snapshot(target=mock.MagicMock(), condition=condition, writer=writer)
    trainer = mock.MagicMock()
    trainer.out = os.path.join(blocker, 'out')
    ext = multi_node_snapshot(comm, snapshot, [])
    ext.initialize(trainer)
    ext(trainer)
    ext(trainer)
    assert writer.call_count == (1 if comm.rank == 0 else 0)
    _all_ranks_still_in_step(comm)


class _Model(chainer.Chain):
    def __init__(self):
        super().__init__()
        with self.init_scope():
            self.l = chainer.links.Linear(2, 1, initialW=1, initial_bias=0)


class _Trainer:
    """Just what a snapshot of the default writer needs: ``out``, ``updater.iteration``, a target."""

    def __init__(self, out):
        self.out = out
        self.updater = mock.MagicMock(iteration=3)


def test_default_writer_error_on_the_master_raises_there_only(comm, private_cwd):
    blocker = os.path.join(private_cwd, 'file')
    open(blocker, 'w').close()
    model = _Model()
    # Every replica set's master (rank 0 and, with 2+ ranks, rank 1) fails alone; the rest write nothing.
    ext = multi_node_snapshot(comm, chainer_extensions.snapshot(target=model), [0])
    trainer = _Trainer(os.path.join(blocker, 'out'))
    ext.initialize(trainer)
    if ext.is_master:
        with pytest.raises(OSError, match='Not a directory|not a directory'):
            ext(trainer)
    else:
        ext(trainer)
    _all_ranks_still_in_step(comm)
    # A master that can write still writes its file through the safe writer, making the directory.
    good = os.path.join(private_cwd, 'made', 'here')
    ext(_Trainer(good))
    names = os.listdir(good) if os.path.isdir(good) else []
    assert names == (['snapshot_iter_3.{}'.format(ext.master)] if ext.is_master else [])
    _all_ranks_still_in_step(comm)


def test_checkpoint_save_error_on_one_rank_raises_there_only(comm):
    path = shared_tmpdir(comm, 'one-rank-ckpt-')
    try:
        cp = create_multi_node_checkpointer('run', comm, path=path, background=False)
        model = _Model()
        failing = comm.size - 1
        if comm.rank == failing:
            cp._readiness_problem = lambda: PermissionError(
                'rank {}: cannot write {}'.format(comm.rank, path))
            with pytest.raises(PermissionError, match='rank {}: cannot write'.format(failing)):
                cp.save(model, iteration=1)
        else:
            assert os.path.basename(cp.save(model, iteration=1)) == 'run.{}.1'.format(comm.rank)
        _all_ranks_still_in_step(comm)
        assert model.l.W.array.tolist() == numpy.ones((1, 2)).tolist()
        # In the background (background=True) the failing rank's save returns None and raises
        # nothing; the failure waits for the next agreement, which every rank calls.
        bg = create_multi_node_checkpointer('bg', comm, path=path, background=True)
        if comm.rank == failing:
            bg._readiness_problem = lambda: PermissionError(
                'rank {}: cannot write {}'.format(comm.rank, path))
            assert bg.save(model, iteration=1) is None
        else:
            assert os.path.basename(bg.save(model, iteration=1)) == 'bg.{}.1'.format(comm.rank)
        _all_ranks_still_in_step(comm)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter('always')
            assert bg.settle() is None
        said = [str(w.message) for w in caught if 'failed on rank' in str(w.message)]
        assert len(said) == (1 if comm.rank == 0 else 0), said
        assert bg.get_stats()['failed_saves'] == 1
        assert bg.local_iterations() == []   # the other ranks' files of it were removed
        _all_ranks_still_in_step(comm)
    finally:
        comm.allreduce_obj(0)
        if comm.rank == 0:
            shutil.rmtree(path, ignore_errors=True)
