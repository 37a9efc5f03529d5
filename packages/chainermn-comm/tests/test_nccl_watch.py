"""The NCCL watchdog thread: callers never wait; errors and hangs are caught and named."""

import io
import threading
import time

import pytest

from chainermn_comm.gpu import _nccl_watch


class FakeEvent:
    """An event whose work finishes when the test says so."""

    def __init__(self):
        self._done = threading.Event()

    @property
    def done(self):
        return self._done.is_set()

    def finish(self):
        self._done.set()


class FakeGroup:
    """Records how the watchdog failed it, as NcclGroup._abort does."""

    def __init__(self, error=None):
        self.error = error
        self.failed = threading.Event()
        self.calls = []

    def poll_error(self):
        if self.error is not None:
            raise self.error

    def fail(self, what, err):
        self.calls.append((what, err))
        self.failed.set()
        return 'rank 0: NCCL {} failed: {}'.format(what, err)


def _until(cond, limit=20.0):
    """Wait for ``cond()`` with a hard limit (the watchdog runs on its own thread)."""
    end = time.monotonic() + limit
    while not cond():
        assert time.monotonic() < end, 'condition not reached within {} s'.format(limit)
        time.sleep(0.001)


def test_watch_returns_before_the_work_finishes_and_drops_finished_work():
    dog = _nccl_watch.NcclWatchdog(stream=io.StringIO())
    group = FakeGroup()
    events = [FakeEvent() for _ in range(3)]
    start = time.monotonic()
    for i, ev in enumerate(events):
        dog.watch(group, ev, 'allreduce_grad {}'.format(i), 60.0, group.poll_error, group.fail)
    assert time.monotonic() - start < 1.0  # nothing waited for the (unfinished) work
    assert dog.outstanding() == 3
    events[1].finish()
    _until(lambda: dog.outstanding() == 2)
    events[0].finish()
    events[2].finish()
    _until(lambda: dog.outstanding() == 0)
    assert group.calls == [] and dog.failures == []


def test_async_error_fails_the_group_once_and_names_the_call():
    out = io.StringIO()
    dog = _nccl_watch.NcclWatchdog(stream=out)
    group = FakeGroup(error=RuntimeError('NCCL_ERROR_REMOTE_ERROR'))
    dog.watch(group, FakeEvent(), 'bcast_data', 60.0, group.poll_error, group.fail)
    dog.watch(group, FakeEvent(), 'allreduce_grad', 60.0, group.poll_error, group.fail)
    assert group.failed.wait(20)
    _until(lambda: dog.outstanding() == 0)
    assert [w for w, _ in group.calls] == ['bcast_data']  # once per group, the oldest call
    assert 'NCCL bcast_data failed: NCCL_ERROR_REMOTE_ERROR' in out.getvalue()


def test_a_call_watched_after_its_group_failed_is_dropped_not_failed_again():
    out = io.StringIO()
    dog = _nccl_watch.NcclWatchdog(stream=out)
    group = FakeGroup(error=RuntimeError('NCCL_ERROR_REMOTE_ERROR'))
    dog.watch(group, FakeEvent(), 'bcast_data', 60.0, group.poll_error, group.fail)
    assert group.failed.wait(20)
    _until(lambda: dog.outstanding() == 0)
    dog.watch(group, FakeEvent(), 'allreduce_grad', 60.0, group.poll_error, group.fail)
    _until(lambda: dog.outstanding() == 0)
    assert [w for w, _ in group.calls] == ['bcast_data']
    assert out.getvalue().count('failed:') == 1


def test_hang_past_the_limit_is_reported_and_other_groups_go_on():
    out = io.StringIO()
    dog = _nccl_watch.NcclWatchdog(stream=out)
    stuck, healthy = FakeGroup(), FakeGroup()
    dog.watch(stuck, FakeEvent(), 'allreduce (intra-node reduce)', 0.2, stuck.poll_error, stuck.fail)
    ok = FakeEvent()
    dog.watch(healthy, ok, 'allreduce', 60.0, healthy.poll_error, healthy.fail)
    assert stuck.failed.wait(20)
    what, err = stuck.calls[0]
    assert what == 'allreduce (intra-node reduce)'
    assert isinstance(err, TimeoutError) and 'did not complete within 0.2 s' in str(err)
    assert 'did not complete within 0.2 s' in out.getvalue()
    assert dog.outstanding() == 1 and healthy.calls == []
    ok.finish()
    _until(lambda: dog.outstanding() == 0)


def test_no_limit_means_no_timeout_and_forget_drops_a_group():
    dog = _nccl_watch.NcclWatchdog(stream=io.StringIO())
    group = FakeGroup()
    dog.watch(group, FakeEvent(), 'allreduce', 0.0, group.poll_error, group.fail)
    dog.forget(group)
    assert dog.outstanding() == 0 and group.calls == []


def test_nccl_group_call_does_not_wait_and_a_failure_makes_the_next_call_raise(monkeypatch):
    """NcclGroup on the NumPy stand-in: the call is watched, not waited for."""
    cupy = pytest.importorskip('cupy')
    if not getattr(cupy, 'IS_FAKE', False):
        pytest.skip('needs the NumPy stand-in for CuPy (tests/fakecupy on sys.path)')
    from chainermn_comm import CommunicationError
    from chainermn_comm.gpu import _nccl
    waits = []
    monkeypatch.setattr(_nccl, 'wait_stream', lambda *a: waits.append(a))
    dog = _nccl_watch.NcclWatchdog(stream=io.StringIO())
    monkeypatch.setattr(_nccl_watch, '_WATCHDOG', dog)
    from mpi4py import MPI

    class Owner:
        rank, timeout = 0, 30.0

    group = _nccl.NcclGroup(MPI.COMM_SELF, 'world', Owner())
    x = cupy.arange(4, dtype='float32')
    group.allreduce(x, x)
    assert waits == []
    _until(lambda: dog.outstanding() == 0)
    message = group._abort('allreduce_grad', RuntimeError('peer gone'))
    assert 'NCCL allreduce_grad failed: peer gone' in message
    with pytest.raises(CommunicationError, match='unusable after an earlier failure'):
        group.allreduce(x, x)
