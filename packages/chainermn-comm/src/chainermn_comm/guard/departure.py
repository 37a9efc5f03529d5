"""The exit notice: a rank that ends tells the other ranks, and a rank waiting for it ends the job.

A rank ends its program (it returns, calls ``sys.exit``, dies of an uncaught exception) or calls
``finalize()``: on its way out it sends every other rank of each of its communicators a small
notice over the guard's side channel (:mod:`.side_channel`): its rank, host, why it ends (with
its exit status when known, :mod:`.exit_status`) and how many collective calls it entered on
that communicator.  The other ranks' watchdog threads read it within a second.  A rank that is
blocked in (or enters) a collective call the leaver never entered, or a point-to-point call
with it, ends the job at once with one line::

    chainermn: rank 1 (host h1) exited with status 3 at collective call #20; rank 0 (host h0) waits
    in call #21 allreduce(...), which rank 1 will never join: ending the job with MPI_Abort(3)

and the exit status of the leaver (:data:`RANK_GONE_EXIT_STATUS` when it was 0 or unknown).

Every notice sent is received, so that no MPI library finds a message nobody took at
``MPI_Finalize`` (UCX warns about each): a rank that ends sends its notice to every other rank of
each communicator it still holds (the guards stay registered until ``finalize()`` or the end)
that has not told it it left, and waits for each one's answer (answering progress queries
meanwhile, at most ``NOTICE_WAIT`` seconds) before it goes on to ``MPI_Finalize``, which waits for
every rank anyway: a rank still running acknowledges it within a second (its watchdog thread)
and sends no notice to it later; ranks that end together answer each other with their notices.  A program that ends normally on every rank pays a few small
messages per communicator at exit.  ``CHAINERMN_EXIT_NOTICE=0`` (on every rank) turns the notice
off.  With the global except hook installed, a
``sys.exit`` with a non-zero status aborts the job at once, like an exception
(:func:`chainermn_comm.global_except_hook.add_hook`).
"""

import atexit
import threading
import time

from chainermn_comm import process, voice
from chainermn_comm.voice import who, world
from chainermn_comm.guard import exit_status
from chainermn_comm.guard.report import describe_wait
from chainermn_comm.guard.side_channel import mpi_lock
from chainermn_comm.protocol import RANK_GONE_EXIT_STATUS

__all__ = ['arm', 'leave', 'blocking', 'interrupted', 'gone_line', 'job_status', 'report_caught', 'P2P_GRACE', 'DEFER',
           'NOTICE_WAIT']

#: Seconds a point-to-point call with a rank that left may still finish (its message may be on
#: the way) before the job is ended.
P2P_GRACE = 2.0
#: Seconds a rank waits before it ends the job when a lower rank may end it first (one line).
DEFER = 3.0
#: Seconds a rank that leaves waits, at most, for the answers of the ranks it told (they answer
#: within a second unless frozen or already in MPI_Finalize).
NOTICE_WAIT = 10.0
#: The guards whose ranks send a notice at exit (held, so that a communicator that was garbage
#: collected on one rank still takes part: its peers send to it and wait for its notice).
_guards = set()
_lock = threading.Lock()
_armed = [False]


def arm(guard):
    """Send ``guard``'s exit notice when this program ends (registers the handler once)."""
    with _lock:
        _guards.add(guard)
        if not _armed[0]:
            _armed[0] = True
            process.install('sys.exit', exit_status.install)   # unless left alone (docs/process.md)
            atexit.register(_at_exit)


def _notice(guard, why, status):
    failed = guard.failed_collective and guard.failed_collective == guard.collective_seq
    return {'rank': guard.rank, 'host': guard.host, 'why': why, 'status': status,
            'collectives': guard.collective_seq, 'failed': bool(failed),
            'interrupted': exit_status.interrupted()}


def leave(guard, why, status=None):
    """Tell the other ranks of ``guard``'s communicator that this rank leaves it, then take theirs.

    Once per guard (``finalize()``, or the program's end); returns when the ranks it told that
    are leaving too have sent theirs, or after ``NOTICE_WAIT`` seconds.
    """
    if _send(guard, why, status):
        _take_notices([guard])
    with _lock:
        _guards.discard(guard)


def _send(guard, why, status):
    """Send ``guard``'s notice to every other rank that has not left (once); return whether it did."""
    watch = guard.watch
    if watch.left or watch.side is None or not guard.config.exit_notice:
        return False
    watch.left = True
    with mpi_lock():
        side = watch.side
        if side is None or _finalized():
            return False
        try:
            side.serve(guard.progress)  # notices that came meanwhile: those ranks take no more
            side.announce(_notice(guard, why, status))
        except Exception:
            return False
    return True


def _take_notices(guards):
    """Serve the side channels of ``guards`` until every rank told has answered (at most ``NOTICE_WAIT`` s).

    A rank told that is still running acknowledges the notice (its watchdog thread, within a
    second) and sends no notice of its own to this rank when it ends; two ranks that end together
    answer each other with their notices.  Only a rank that no longer serves its channel (frozen,
    or in ``MPI_Finalize`` already) leaves this rank waiting the whole ``NOTICE_WAIT``.
    """
    deadline = time.monotonic() + NOTICE_WAIT
    pending = list(guards)
    pause = 0.001
    while pending and time.monotonic() < deadline:
        left = []
        with mpi_lock():
            for g in pending:
                side = g.watch.side
                if side is None or _finalized():
                    continue
                try:
                    side.serve(g.progress)
                    done = side.told <= (set(side.departed) | side.acked) and side.sends_done()
                except Exception:
                    continue
                if not done:
                    left.append(g)
        pending = left
        if pending:
            time.sleep(pause)
            pause = min(0.05, pause * 2)


def _finalized():
    from mpi4py import MPI
    return not MPI.Is_initialized() or MPI.Is_finalized()


def _at_exit():
    """Program exit: abort under the except hook for a non-zero ``sys.exit``, else exchange notices."""
    try:
        if exit_status.forked() or _finalized():  # a fork()ed child's end is not this rank's
            return
        status, why = exit_status.leaving()
        if exit_status.exit_called() and exit_status.abort_for(status):
            return
        with _lock:
            guards = list(_guards)
            _guards.clear()
        # Every notice goes out before this rank waits for any: no two ranks wait on each other.
        sent = [g for g in guards if _send(g, why, status)]
        _take_notices(sent)
        for g in guards:
            side = g.watch.side
            for notice, _ in (side.departed.values() if side is not None else ()):
                report_caught(g, notice)
    except Exception:
        pass


def report_caught(guard, notice):
    """Print the error every rank raised together that this rank caught, when ``notice``'s rank ended with it.

    The reporting rank (rank 0 of the communicator) prints such an error when it is not caught;
    when that rank catches it and goes on while the others end with it, it prints it here (before
    it ends the job, or at its exit), so that the report is never lost.
    """
    pending = guard.agreement.unreported
    if pending is None or not notice.get('status') or notice.get('collectives') != pending[0]:
        return  # not ended with an error right after that call
    guard.agreement.unreported = None
    if not voice.shown(pending[1]):
        voice.report_caught(pending[1], 'at collective call #{}'.format(pending[0]))


def blocking(cur, departed, now):
    """Return ``(rank, notice)`` of a rank that left and that call ``cur`` waits for, else None.

    A collective call waits for every rank: it cannot finish when a rank left after fewer
    collectives, or inside this one.  A point-to-point call waits for its peer only, which may
    have sent before it left: it gets ``P2P_GRACE`` seconds.
    """
    number, info = cur.number, cur.info
    for peer, (notice, seen) in sorted(departed.items()):
        if number:
            done = notice['collectives']
            if number > done or (number == done and notice['failed']):
                return peer, notice
        elif peer in (info.get('source'), info.get('dest')) and \
                now - max(seen, cur.start) >= P2P_GRACE:
            return peer, notice
    return None


def interrupted(cur, departed, now):
    """Return ``(rank, notice)`` of a rank that Ctrl-C ended, once call ``cur`` has waited ``P2P_GRACE``
    seconds since, else None: the job is being interrupted, so no call waits for it to finish."""
    for peer, (notice, seen) in sorted(departed.items()):
        if notice.get('interrupted') and now - max(seen, cur.start) >= P2P_GRACE:
            return peer, notice
    return None


def job_status(notice):
    """Return the status to end the job with: the leaver's non-zero status, else RANK_GONE_EXIT_STATUS."""
    status = notice.get('status')
    return status if isinstance(status, int) and 0 < status < 256 else RANK_GONE_EXIT_STATUS


def gone_line(guard, cur, notice, status):
    """Return the one line of a rank that ends the job because ``notice``'s rank left."""
    where = 'in its collective call' if notice['failed'] else 'at collective call'
    world_of = getattr(guard, 'world_of', None)
    return ('chainermn: {} {} {} #{}; {} waits in {}, which rank {} will never join: ending the job '
            'with MPI_Abort({})'.format(
                who(notice['rank'], notice['host'], world_of), notice['why'], where,
                notice['collectives'], who(guard.rank, guard.host, world_of), describe_wait(cur),
                world(notice['rank'], world_of), status))
