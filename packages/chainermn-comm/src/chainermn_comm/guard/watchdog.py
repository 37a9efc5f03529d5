"""The watchdog: one daemon thread per process that reports stalled calls and ends hung jobs.

It answers the other ranks' progress queries (:mod:`side_channel`), reports a call that has
waited ``$CHAINERMN_STALL_SECONDS`` (which ranks have not reached it) and aborts the job with
``MPI_Abort(WATCHDOG_EXIT_STATUS)`` when a call outlives ``$CHAINERMN_TIMEOUT``.
"""

import atexit
import faulthandler
import os
import sys
import threading
import time
import weakref

from chainermn_comm.guard import report
from chainermn_comm.guard.side_channel import SideChannel, side_channel_available
from chainermn_comm.log import get_logger
from chainermn_comm.protocol import STALL_SECONDS_ENV, TIMEOUT_ENV, WATCHDOG_EXIT_STATUS

__all__ = ['Watch', 'watch', 'mpi_lock', 'WATCHDOG_EXIT_STATUS']

#: Seconds between the watchdog's report and MPI_Abort.
_ABORT_GRACE = 1.0
#: Seconds between two rounds of answering the other ranks' progress queries.
SERVE_PERIOD = 1.0

_log = get_logger('watchdog')


class _Thread(threading.Thread):
    """Daemon thread: answers progress queries, reports stalled calls, aborts calls past their timeout."""

    def __init__(self):
        super().__init__(name='chainermn-watchdog', daemon=True)
        self._guards = weakref.WeakSet()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        #: Held while the thread makes MPI calls; taken for good at program exit (before MPI_Finalize).
        self.mpi_lock = threading.Lock()
        self.closed = False

    def add(self, guard):
        with self._lock:
            self._guards.add(guard)
        self._wake.set()

    def close(self):
        """Stop every MPI call of this thread (called at exit, before MPI_Finalize)."""
        with self.mpi_lock:
            self.closed = True

    def run(self):
        while True:
            with self._lock:
                guards = list(self._guards)
            now = time.monotonic()
            wait = SERVE_PERIOD
            for g in guards:
                try:
                    wait = min(wait, g.tick(now, self))
                except Exception as e:  # never let the thread die: it guards the whole job
                    try:
                        _log.error('chainermn watchdog: %s: %s', type(e).__name__, e)
                    except Exception:
                        pass
            del guards
            self._wake.wait(max(0.02, wait))
            self._wake.clear()


_thread = None
_thread_lock = threading.Lock()


def watch(guard):
    """Have the watchdog thread (started on first use) tick ``guard``."""
    global _thread
    with _thread_lock:
        if _thread is None:
            _thread = _Thread()
            # Registered after mpi4py's MPI_Finalize hook, so it runs before it (LIFO).
            atexit.register(_thread.close)
            _thread.start()
    _thread.add(guard)


def mpi_lock():
    """Return the lock the watchdog thread holds while it calls MPI (a fresh one before it starts)."""
    return _thread.mpi_lock if _thread is not None else threading.Lock()


def _mpi_finalized():
    from mpi4py import MPI
    return MPI.Is_finalized()


class Watch:
    """A guard's stall-inspector state: its side channel (or why it has none), what it reported."""

    def __init__(self, mpi_comm, stall_seconds, size):
        self.side = None
        self.why = ''
        self.last_serve = 0.0
        self.reported = None  # the call the stall report was printed for
        if stall_seconds > 0 and size > 1:
            ok, self.why = side_channel_available()
            if ok:
                self.side = SideChannel(mpi_comm)

    def close(self):
        """Free the side channel (collective; call before freeing the communicator)."""
        side, self.side = self.side, None
        if side is None:
            return
        with mpi_lock():
            try:
                from mpi4py import MPI
                if not MPI.Is_finalized():
                    side.comm.Free()
            except Exception:
                pass

    def tick(self, guard, now, thread):
        """Do ``guard``'s watchdog work; return the seconds until it needs the thread again."""
        wait = SERVE_PERIOD
        side = self.side
        timeout = guard.config.timeout
        if side is not None and (now - self.last_serve >= SERVE_PERIOD or side.asking):
            with thread.mpi_lock:
                if thread.closed or self.side is not side or _mpi_finalized():
                    self.side = side = None  # program exit, close(), or MPI_Finalize called
                else:
                    side.serve(guard.progress)
                    self.last_serve = now
        cur = guard.current
        if cur is None:
            if side is not None and side.asking:
                side.cancel()
            return wait if timeout <= 0 else min(wait, timeout / 4.0)
        elapsed = now - cur[3]
        if timeout > 0:
            if elapsed >= timeout:
                guard.fire(cur, elapsed)
            wait = min(wait, timeout - elapsed, timeout / 4.0)
        stall_seconds = guard.config.stall_seconds
        if stall_seconds > 0 and self.reported is not cur:
            if elapsed < stall_seconds:
                return min(wait, stall_seconds - elapsed)
            if side is None:
                self.report_stall(guard, cur, elapsed, None)
            elif not side.asking:
                with thread.mpi_lock:
                    if thread.closed or self.side is not side:
                        return wait
                    side.ask()
                return 0.1
            else:
                answers = side.answers_ready()
                if answers is None:
                    return 0.1
                self.report_stall(guard, cur, elapsed, answers)
        return wait

    def report_stall(self, guard, cur, elapsed, answers):
        self.reported = cur
        why = self.why or 'the stall inspector\'s side channel is closed'
        try:
            _log.warning('%s', report.format_stall_report(
                guard.rank, guard.size, guard.host, report.describe(cur), elapsed, cur[5], answers,
                guard.config.timeout, STALL_SECONDS_ENV, TIMEOUT_ENV, why).rstrip('\n'))
        except Exception:
            pass


def _flush_trace():
    try:
        from chainermn_comm import trace
        if trace.ON:
            trace.flush('watchdog')
    except Exception:
        pass


def fire(guard, cur, elapsed):
    """Report ``guard``'s stuck call with every thread's stack and abort the whole job."""
    try:
        last = 'none' if guard.last is None else report.describe(guard.last)
        checking = ''
        if guard.agreement.in_check and guard.agreement.debug_comm is not None \
                and cur[0] != report.EXIT_CALL:
            checking = ' (in the agreement check before it)'
        _log.critical('%s', report.watchdog_message(
            guard.rank, guard.size, report.describe(cur), checking, elapsed, guard.config.timeout,
            TIMEOUT_ENV, guard.host, last, WATCHDOG_EXIT_STATUS))
        sys.stderr.flush()
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        sys.stderr.flush()
    except Exception:
        pass
    finally:
        try:
            # The other ranks' watchdogs usually fire at the same moment: give their reports
            # time to reach the terminal before this abort kills them.  Write the trace
            # (CHAINERMN_TRACE) meanwhile: the watchdog thread can, the stuck main thread cannot.
            started = time.monotonic()
            _flush_trace()
            time.sleep(max(0.0, _ABORT_GRACE - (time.monotonic() - started)))
            from mpi4py import MPI
            MPI.COMM_WORLD.Abort(WATCHDOG_EXIT_STATUS)
        finally:
            os._exit(WATCHDOG_EXIT_STATUS)
