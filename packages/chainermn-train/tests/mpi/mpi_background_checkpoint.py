"""Background checkpoint writes (run on every rank by test_background_checkpoint_mpi.py).

The copy taken at a save is what is written while training changes the model; one write is in
flight at a time; the agreement records complete generations; a failing save is reported once,
counted, and training goes on; an incomplete generation is never loaded.
"""

import os
import shutil
import sys
import warnings
from unittest import mock

import chainer
import numpy
import pytest
from chainermn_comm.testing import shared_tmpdir

sys.path.insert(0, os.path.dirname(__file__))
import _common  # noqa: E402

from chainermn_train import create_multi_node_checkpointer  # noqa: E402
from chainermn_train.checkpoint.write import complete, saving, writer  # noqa: E402
import threading  # noqa: E402

comm = _common.comm()


class Model(chainer.Link):
    def __init__(self, value=0.0):
        super().__init__()
        with self.init_scope():
            self.W = chainer.Parameter(numpy.full((32, 8), value, numpy.float32))
            self.b = chainer.Parameter(numpy.full((8,), value, numpy.float32))


@pytest.fixture
def path():
    p = shared_tmpdir(comm, 'bg-ckpt-')
    yield p
    comm.allreduce_obj(0)
    if comm.rank == 0:
        shutil.rmtree(p, ignore_errors=True)


def _resumed(path, **kw):
    cp = create_multi_node_checkpointer('bg', comm, path=path, **kw)
    model = Model(-7.0)
    return cp, model, cp.maybe_load(model)


def test_the_copy_taken_at_the_save_is_written_while_training_goes_on(path):
    cp = create_multi_node_checkpointer('bg', comm, path=path, background=True)
    assert cp.background
    model = Model()
    for it in (1, 2, 3):
        model.W.array[...] = it + comm.rank   # ranks differ: each writes its own
        model.b.array[...] = it
        assert cp.save(model, iteration=it) == cp.filename(it)
        model.W.array[...] = -1   # training goes on while the write runs
        model.b.array[...] = -1
    assert cp.settle() == 3   # every rank's writes finished: 1, 2 and 3 are complete
    st = cp.get_stats()
    assert (st['saves'], st['failed_saves'], st['in_flight']) == (3, 0, None)
    # One page-aligned buffer holding the whole file (the arrays and their headers), reused.
    assert st['staging_bytes'] % 4096 == 0
    assert (32 * 8 + 8) * 4 < st['staging_bytes'] <= os.path.getsize(cp.filename(3)) + 4095
    records = complete.read_records(path, 'bg')
    assert {(cp.run_id, it) for it in (1, 2, 3)} <= records
    cp2, model2, got = _resumed(path)
    assert got == 3
    assert (model2.W.array == 3 + comm.rank).all() and (model2.b.array == 3).all()
    cp2.finalize()   # a completed run (no trainer): its files go
    cp.finalize()
    assert cp.local_iterations() == []


def test_the_next_save_waits_for_the_write_in_flight(path):
    cp = create_multi_node_checkpointer('bg', comm, path=path, background=True)
    model = Model(1.0)
    cp.save(model, iteration=1)
    assert cp._flight.busy or cp.get_stats()['saves'] == 0
    spans = []
    real_span = saving.trace.span

    def span(name, cat, **kw):
        spans.append(name)
        return real_span(name, cat, **kw)

    with mock.patch.object(saving.trace, 'span', span):
        cp.save(model, iteration=2)   # waits for 1 before copying
    assert spans == ['checkpoint save', 'checkpoint wait'], spans   # the wait: its own event
    assert cp.get_stats()['saves'] == 1   # 1 collected; 2 in flight or done, not collected
    assert cp.settle() == 2
    assert cp.get_stats()['saves'] == 2


def test_a_failing_write_is_reported_once_and_training_goes_on(path):
    cp = create_multi_node_checkpointer('bg', comm, path=path, cp_interval=1, gc_interval=1, background=True)
    model = Model(5.0)
    cp.save(model, iteration=5)
    assert cp.settle() == 5
    failing = comm.size - 1
    real = writer.write_atomically

    def full(final, write, rank=None, **kwargs):
        raise OSError(28, 'No space left on device', final)

    with mock.patch.object(writer, 'write_atomically', full if comm.rank == failing else real):
        model.W.array[...] = 10
        cp.save(model, iteration=10)   # fails in the background thread of the failing rank
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter('always')
            assert cp.settle() is None
    said = [str(w.message) for w in caught]
    if comm.rank == 0:
        assert len(said) == 1 and 'iteration 10 failed on rank(s) {} (OSError'.format(failing) in said[0], said
        assert 'newest complete generation (iteration 5) stays' in said[0], said
    else:
        assert said == []
    assert cp.get_stats()['failed_saves'] == 1
    assert cp.local_iterations() == [5]   # the others' files of 10 are gone; 5 stays
    model.W.array[...] = 15
    cp.save(model, iteration=15)   # the next save tries again, and succeeds
    assert cp.settle() == 15
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        cp._trainer = mock.Mock(stop_trigger=object())   # not a completed run: files stay
        cp._completed = lambda: False
        cp.finalize()
    said = [str(w.message) for w in caught]
    assert ['1 save(s) of the job failed' in s for s in said] == ([True] if comm.rank == 0 else []), said
    _, model2, got = _resumed(path)
    assert got == 15 and (model2.W.array == 15).all()


def test_a_directory_replaced_by_a_file_fails_the_save_not_the_job(path):
    cp = create_multi_node_checkpointer('bg', comm, path=path, background=True)
    model = Model(1.0)
    cp.save(model, iteration=1)
    assert cp.settle() == 1
    comm.allreduce_obj(0)
    if comm.rank == 0:   # the directory goes away and a file takes its name
        os.rename(path, path + '.aside')
        open(path, 'w').close()
    comm.allreduce_obj(0)
    assert cp.save(model, iteration=2) is None   # nothing raised on any rank
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        assert cp.settle() is None
    said = [str(w.message) for w in caught]
    assert len(said) == (1 if comm.rank == 0 else 0), said
    if comm.rank == 0:
        assert 'iteration 2 failed on rank(s) ' + ', '.join(
            '{} ('.format(r) for r in range(comm.size)) in said[0].replace('(NotADirectoryError', '(') \
            or 'iteration 2 failed on rank(s) 0' in said[0], said
        os.unlink(path)
        os.rename(path + '.aside', path)
    comm.allreduce_obj(0)
    model.W.array[...] = 3
    cp.save(model, iteration=3)
    assert cp.settle() == 3
    assert cp.get_stats()['failed_saves'] == 1
    _, model2, got = _resumed(path)
    assert got == 3 and (model2.W.array == 3).all()


@pytest.mark.skipif(comm.size < 2, reason='needs a rank that did not write')
def test_an_incomplete_generation_is_never_loaded_and_is_removed(path):
    cp = create_multi_node_checkpointer('bg', comm, path=path, background=True)
    model = Model(4.0)
    cp.save(model, iteration=4)
    assert cp.settle() == 4
    if comm.rank == 0:   # as if the others were killed during their write of 8
        model.W.array[...] = 8
        cp.save(model, iteration=8)
        cp._drain()
        assert os.path.exists(cp.filename(8))
    comm.allreduce_obj(0)
    with warnings.catch_warnings(record=True):
        warnings.simplefilter('always')
        _, model2, got = _resumed(path)
    assert got == 4 and (model2.W.array == 4).all()
    comm.allreduce_obj(0)
    assert not os.path.exists(cp.filename(8, 0))   # rank 0 removed its file of the incomplete one


def test_synchronous_writes_are_there_when_save_returns(path):
    cp = create_multi_node_checkpointer('bg', comm, path=path, background=False)
    fn = cp.save(Model(2.0), iteration=2)
    assert os.path.exists(fn) and not cp._flight.busy
    assert cp.settle() is None   # nothing in flight, nothing to agree on


def test_finalize_after_an_error_on_one_rank_waits_for_its_write_alone(path):
    cp = create_multi_node_checkpointer('bg', comm, path=path, background=True)
    model = Model(6.0)
    fn = cp.save(model, iteration=6)
    if comm.rank == comm.size - 1:   # this rank alone met an error: no collective from here
        cp.on_error(None, RuntimeError('boom'), None)
        cp.finalize()
        assert os.path.exists(fn) and not cp._flight.busy   # written, not dropped; files stay
    assert comm.allgather_obj(comm.rank) == list(range(comm.size))   # still in step


def test_a_write_that_does_not_finish_in_time_is_reported_not_dropped(path):
    cp = create_multi_node_checkpointer('bg', comm, path=path, write_timeout=0.2, background=True)
    model = Model(7.0)
    slow = comm.size - 1
    release = threading.Event()
    real = writer.write_atomically

    def stuck(final, write, rank=None, **kwargs):
        release.wait(60)
        return real(final, write, rank, **kwargs)

    with mock.patch.object(writer, 'write_atomically', stuck if comm.rank == slow else real):
        cp.save(model, iteration=7)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter('always')
            assert cp.settle() is None
        said = [str(w.message) for w in caught]
        if comm.rank == 0:
            assert len(said) == 1 and 'its write had not finished after' in said[0], said
        assert cp.get_stats()['failed_saves'] == 1 and cp._flight.busy == (comm.rank == slow)
        release.set()
        with warnings.catch_warnings(record=True):
            warnings.simplefilter('always')
            cp._completed = lambda: False
            cp.finalize()   # waits for the write in flight, which now finishes
    assert not cp._flight.busy
    comm.allreduce_obj(0)


def _trainer_with_checkpointer(path, stop, saves):
    import chainer.functions as F
    import chainer.links as L
    import chainermn_train
    rs = numpy.random.RandomState(3)
    model = L.Linear(4, 3, initialW=rs.standard_normal((3, 4)).astype(numpy.float32))
    x = rs.standard_normal((16, 4)).astype(numpy.float32)
    y = rs.standard_normal((16, 3)).astype(numpy.float32)
    opt = chainermn_train.create_multi_node_optimizer(chainer.optimizers.Adam(), comm)
    opt.setup(model)
    it = chainer.iterators.SerialIterator(list(zip(x, y)), 2, shuffle=False)
    updater = chainer.training.updaters.StandardUpdater(
        it, opt, converter=chainer.dataset.concat_examples,
        loss_func=lambda xb, yb: F.mean_squared_error(model(xb), yb))
    trainer = chainer.training.Trainer(updater, (stop, 'iteration'), out=os.path.join(path, 'out'))
    cp = create_multi_node_checkpointer('tr', comm, path=path, cp_interval=5, gc_interval=5)
    assert cp.background   # the default
    trainer.extend(cp, trigger=chainer.training.triggers.ManualScheduleTrigger(saves, 'iteration'))
    return trainer, cp


def test_the_extension_agrees_on_a_write_within_an_iteration_of_its_end(path):
    # Saves at 5 and 10; training goes on until the ranks agreed on 10 (the trigger's poll:
    # ``_armed`` is the same on every rank), however long its write takes on a loaded machine.
    trainer, cp = _trainer_with_checkpointer(path, stop=10000, saves=[5, 10])
    trainer.stop_trigger = lambda t: t.updater.iteration >= 10000 or (
        t.updater.iteration > 10 and not cp._armed)
    seen = []

    def observe(t):   # after the checkpointer's trigger (which polls) every iteration
        finished = all(comm.allgather_obj(not cp._flight.running))
        agreed = [it for it in (5, 10) if it in cp._committed]
        seen.append((t.updater.iteration, finished, agreed,
                     sorted(i for _, i in complete.read_records(path, 'tr'))))

    trainer.extend(observe, trigger=(1, 'iteration'), priority=0)
    trainer.run()
    assert trainer.updater.iteration < 10000, seen[-1]
    for save in (5, 10):
        # The first iteration (from the save on) at which every rank's write had finished: the
        # poll of the next iteration at the latest agrees on it and records it complete.
        done = next(i for i, finished, _, _ in seen if i >= save and finished)
        agreed = next(i for i, _, ags, _ in seen if save in ags)
        assert save <= agreed <= done + 1, (save, done, agreed, seen)
        assert save in next(recs for i, _, _, recs in seen if i == agreed), seen
    st = cp.get_stats()
    assert st['polls'] >= 1 and st['failed_saves'] == 0, st
    assert cp.local_iterations() == []   # a completed run removed its snapshots


def test_a_failing_save_of_the_extension_is_counted_and_training_goes_on(path):
    trainer, cp = _trainer_with_checkpointer(path, stop=17, saves=[5, 10, 15])
    failing = comm.size - 1
    real = writer.write_atomically
    kept = {}

    def full_at_10(final, write, rank=None, **kwargs):
        if final.endswith('.10'):
            raise OSError(28, 'No space left on device', final)
        return real(final, write, rank, **kwargs)

    def observe(t):
        if 10 <= t.updater.iteration < 15 and cp.get_stats()['failed_saves']:   # agreed by a poll
            kept[t.updater.iteration] = cp.local_iterations()

    trainer.extend(observe, trigger=(1, 'iteration'), priority=0)
    with mock.patch.object(writer, 'write_atomically', full_at_10 if comm.rank == failing else real):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter('always')
            trainer.run()
    said = [str(w.message) for w in caught]
    failed = [s for s in said if 'iteration 10 failed on rank(s) {} (OSError'.format(failing) in s]
    counted = [s for s in said if '1 save(s) of the job failed' in s]
    if comm.rank == 0:
        assert len(failed) == 1 and 'newest complete generation (iteration 5) stays' in failed[0], said
        assert len(counted) == 1, said
    else:
        assert failed == [] and counted == [], said
    assert all(v == [5] for v in kept.values()), kept   # 10 failed: 5 stays, alone on disk
    assert trainer.updater.iteration == 17 and cp.get_stats()['failed_saves'] == 1
