"""The watchdog: one daemon thread per process that reports stalled calls and ends hung jobs.

It answers the other ranks' progress queries (:mod:`side_channel`) and takes their exit notices
(:mod:`departure`); it ends the job at once when this rank waits in a call a rank that left will
never join; it reports a call that has waited ``$CHAINERMN_STALL_SECONDS`` (which ranks have not
reached it, whether they answered, what to do), then keeps asking and ends the job when a rank
has left its queries unanswered for ``$CHAINERMN_UNRESPONSIVE_SECONDS`` (frozen); and it aborts
the job with ``MPI_Abort(WATCHDOG_EXIT_STATUS)`` when a call outlives ``$CHAINERMN_TIMEOUT``.
"""

import atexit
import faulthandler
import os
import sys
import threading
import time
import weakref

from chainermn_comm import voice
from chainermn_comm.guard import departure
from chainermn_comm.guard import report
from chainermn_comm.guard.side_channel import SideChannel, mpi_lock, side_channel_available
from chainermn_comm.log import get_logger
from chainermn_comm.protocol import (RANK_GONE_EXIT_STATUS, STALL_SECONDS_ENV, TIMEOUT_ENV,
                                     UNRESPONSIVE_SECONDS_ENV, WATCHDOG_EXIT_STATUS)

__all__ = ['Watch', 'watch', 'mpi_lock', 'end_job', 'WATCHDOG_EXIT_STATUS', 'RANK_GONE_EXIT_STATUS']

#: Seconds between the watchdog's report and MPI_Abort.
_ABORT_GRACE = 1.0
#: Seconds between a one-line end of the job and MPI_Abort (the launcher forwards the line).
_LINE_GRACE = 0.5
#: Seconds between two rounds of answering the other ranks' progress queries.
SERVE_PERIOD = 1.0
#: Seconds between two progress queries of a rank that keeps waiting after its stall report.
REASK_PERIOD = 5.0

_log = get_logger('watchdog')


class _Thread(threading.Thread):
    """Daemon thread: answers progress queries, reports stalled calls, aborts calls past their timeout."""

    def __init__(self):
        super().__init__(name='chainermn-watchdog', daemon=True)
        self._guards = weakref.WeakSet()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        #: Held while the thread makes MPI calls; taken for good at program exit (before MPI_Finalize).
        self.mpi_lock = mpi_lock()
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


def _mpi_finalized():
    from mpi4py import MPI
    return MPI.Is_finalized()


class Watch:
    """A guard's side-channel state: the channel (or why it has none), stall report, departures.

    Its channel exists on communicators of several ranks when the stall inspector or the exit
    notice is on; :attr:`left` once this rank sent its exit notice; :attr:`pending` is an end of
    the job this rank will make unless a lower rank makes it first: ``(call, when, line, status)``.
    """

    def __init__(self, mpi_comm, config, size):
        self.side = None
        self.why = ''
        self.last_serve = 0.0
        self.reported = None  # the call the stall report was printed for
        self.left = False
        self.pending = None
        self.next_ask = 0.0
        self.asked_for = None  # the call whose stall the side channel's queries are about
        #: The answers of the last stall report (rank -> progress).
        self.last_answers = {}
        if size > 1 and (config.stall_seconds > 0 or config.exit_notice):
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
                    # Program exit, close(), or MPI_Finalize called: this thread leaves the channel
                    # alone (the exit notice still needs it, from the main thread).
                    side = None
                else:
                    side.serve(guard.progress)
                    self.last_serve = now
        cur = guard.current
        if cur is None or (self.pending is not None and self.pending[0] is not cur):
            self.pending = None
        if self.asked_for is not None and self.asked_for is not cur:
            self.asked_for = None
            if side is not None:
                side.cancel()  # that call ended: its queries and silences are over
        if cur is None:
            return wait if timeout <= 0 else min(wait, timeout / 4.0)
        elapsed = now - cur.start
        if self.pending is not None and now >= self.pending[1]:
            end_job(guard, self.pending[2], self.pending[3])
        if side is not None and side.departed and cur.name != report.EXIT_CALL:
            self._check_departed(guard, cur, side, now)
        if timeout > 0:
            if elapsed >= timeout:
                guard.fire(cur, elapsed)
            wait = min(wait, timeout - elapsed, timeout / 4.0)
        stall_seconds = guard.config.stall_seconds
        if stall_seconds <= 0:
            return wait
        if self.reported is not cur:
            if elapsed < stall_seconds:
                return min(wait, stall_seconds - elapsed)
            if side is None:
                self.report_stall(guard, cur, elapsed, None)
            elif not side.asking:
                with thread.mpi_lock:
                    if thread.closed or self.side is not side:
                        return wait
                    side.ask()
                    self.asked_for = cur
                    self.next_ask = now + REASK_PERIOD
                return 0.1
            else:
                answers = side.answers_ready()
                if answers is None:
                    return 0.1
                self.report_stall(guard, cur, elapsed, answers)
        if side is not None and guard.config.unresponsive_seconds > 0:
            wait = min(wait, self._follow_up(guard, cur, side, now, thread))
        return wait

    def _follow_up(self, guard, cur, side, now, thread):
        """After the stall report: keep asking; end the job when a rank stays silent too long."""
        if side.asking:
            side.answers_ready()  # the answers only matter as signs of life (side.heard)
        elif now >= self.next_ask:
            with thread.mpi_lock:
                if thread.closed or self.side is not side:
                    return SERVE_PERIOD
                side.ask()
                self.asked_for = cur
            self.next_ask = now + REASK_PERIOD
        limit = guard.config.unresponsive_seconds
        for peer in range(guard.size):
            if peer == guard.rank or peer in side.departed:
                continue
            silent = side.silent_for(peer, now)
            if silent >= limit:
                answer = self.last_answers.get(peer)
                line = report.unresponsive_line(
                    guard.rank, guard.host, peer, answer['host'] if answer else guard.hosts_of(peer),
                    silent, report.describe_wait(cur), _last_answer(answer), UNRESPONSIVE_SECONDS_ENV,
                    RANK_GONE_EXIT_STATUS, guard.world_of)
                self._end(guard, cur, now, line, RANK_GONE_EXIT_STATUS,
                          lambda p: p not in side.departed and side.silent_for(p, now) < limit)
                break
        if side.asking:
            return 0.1
        return max(0.1, min(SERVE_PERIOD, self.next_ask - now))

    def _check_departed(self, guard, cur, side, now):
        found = departure.blocking(cur, side.departed, now) or \
            departure.interrupted(cur, side.departed, now)
        if found is None:
            return
        notice = found[1]
        departure.report_caught(guard, notice)
        status = departure.job_status(notice)
        if notice.get('interrupted'):
            # Ctrl-C: the job's one report is rank 0's (here or in its excepthook), no gone line.
            if voice.world_rank() == 0:
                voice.report_interrupt_here(frame=_main_frame())
            line = None
        else:
            line = departure.gone_line(guard, cur, notice, status)
        self._end(guard, cur, now, line, status, lambda p: p not in side.departed)

    def _end(self, guard, cur, now, line, status, alive):
        """End the job now, or after ``departure.DEFER`` s when a lower live rank may end it first."""
        if self.pending is not None:
            return
        if any(alive(p) for p in range(guard.rank)):
            self.pending = (cur, now + departure.DEFER, line, status)
        else:
            end_job(guard, line, status)

    def report_stall(self, guard, cur, elapsed, answers):
        self.reported = cur
        if answers:
            self.last_answers = dict(answers)
        why = self.why or 'the stall inspector\'s side channel is closed'
        side = self.side
        departed = {p: n for p, (n, _) in side.departed.items()} if side is not None else None
        try:
            _log.warning('%s', report.format_stall_report(report.Stall(
                guard.rank, guard.size, guard.host, report.describe(cur), elapsed, cur.number,
                answers, guard.config.timeout, STALL_SECONDS_ENV, TIMEOUT_ENV, why, departed,
                guard.config.unresponsive_seconds, UNRESPONSIVE_SECONDS_ENV,
                guard.world_of)).rstrip('\n'))
        except Exception:
            pass


def _last_answer(answer):
    if not answer:
        return ''
    return 'last entered collective call #{}, {}'.format(
        answer['collectives'], 'in ' + answer['call'] if answer['call'] else 'not inside a chainermn call')


def _flush_trace():
    try:
        from chainermn_comm import trace
        if trace.ON:
            trace.flush('watchdog')
    except Exception:
        pass


def _hold_mpi_lock():
    """Take the watchdog's MPI lock for good: the program's exit (its atexit handler) now waits."""
    try:
        mpi_lock().acquire(timeout=5.0)
    except Exception:
        pass


def _abort(status, grace):
    """Write the trace, wait ``grace`` s for the output to leave, then MPI_Abort(status); never return."""
    try:
        # The other ranks' watchdogs often end the job at the same moment: give their reports
        # time to reach the terminal before this abort kills them.  Write the trace
        # (CHAINERMN_TRACE) meanwhile: the watchdog thread can, a stuck main thread cannot.
        started = time.monotonic()
        _flush_trace()
        time.sleep(max(0.0, grace - (time.monotonic() - started)))
        from mpi4py import MPI
        MPI.COMM_WORLD.Abort(status)
    finally:
        os._exit(status)


def _main_frame():
    """Return the main thread's current frame, or None."""
    try:
        return sys._current_frames().get(threading.main_thread().ident)
    except Exception:
        return None


def end_job(guard, line, status):
    """Print ``line`` (one line, as it is; None: nothing) and end the whole job with MPI_Abort(``status``)."""
    _hold_mpi_lock()
    try:
        if line is not None:
            _log.critical('%s', line, extra={'chainermn_plain': True})
        sys.stderr.flush()
    except Exception:
        pass
    _abort(status, _LINE_GRACE)


def fire(guard, cur, elapsed):
    """Report ``guard``'s stuck call with every thread's stack and abort the whole job."""
    # From here on the job ends with WATCHDOG_EXIT_STATUS, as the report says, even when the
    # call finishes meanwhile: the program's exit waits for this lock.
    _hold_mpi_lock()
    try:
        last = 'none' if guard.last is None else report.describe(guard.last)
        checking = ''
        if guard.agreement.in_check and guard.agreement.debug_comm is not None \
                and cur.name != report.EXIT_CALL:
            checking = ' (in the agreement check before it)'
        _log.critical('%s', report.watchdog_message(
            guard.rank, guard.size, report.describe(cur), checking, elapsed, guard.config.timeout,
            TIMEOUT_ENV, guard.host, last, WATCHDOG_EXIT_STATUS, guard.world_of))
        sys.stderr.flush()
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        sys.stderr.flush()
    except Exception:
        pass
    finally:
        _abort(WATCHDOG_EXIT_STATUS, _ABORT_GRACE)
