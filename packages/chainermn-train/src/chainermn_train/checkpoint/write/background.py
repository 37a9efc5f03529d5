"""The one snapshot write in flight: a background thread writes it, the checkpointer waits for it.

The thread runs at a lower CPU priority than training (:data:`WRITER_NICENESS`) and spreads a
staged write over part of the time until the next save is expected (:data:`SPREAD`: the disk
reads the pages from memory while training reads and writes its own, and both share the
machine's memory bandwidth, so a write at full speed slows the iterations it overlaps).  Once
training waits for the write (the next save, a load, the end), it goes at full speed and, where the
system allows it, gets its priority back (:class:`_Paced`).

:class:`InFlight` runs one write at a time on a daemon thread and keeps its outcome (the
iteration, the bytes written or the error) until the checkpointer collects it with :meth:`wait`,
which is bounded: a write that has not finished in time is reported as such, never dropped (the
thread goes on; the next save waits for it again).  A process that exits without finalizing its
checkpointer still waits for the write in flight (``atexit``, bounded).

:data:`kill_at` (``'POINT'`` or ``'POINT@RANK'``; a test hook that only code sets, never the
environment) makes the process SIGKILL itself at the named point of a save: see :data:`KILL_POINTS`.
"""

import atexit
import os
import signal
import threading
import time
import weakref

__all__ = ['InFlight', 'Outcome', 'KILL_POINTS', 'kill_at', 'kill_point', 'EXIT_WAIT_SECONDS',
           'WRITER_NICENESS', 'SPREAD', 'MAX_SPREAD_SECONDS', 'join_others']

#: Test hook (the crash tests set it): ``'POINT'`` or ``'POINT@RANK'`` kills this process
#: (SIGKILL) when a save reaches that point; None (always, outside those tests): never.
kill_at = None
#: The points of a save at which :data:`kill_at` may kill, in the order a save meets them
#: (``before-poll``: this rank's write is durable, it has not told the others at the poll yet).
KILL_POINTS = ('before-copy', 'after-copy', 'mid-write', 'before-rename', 'after-rename',
               'before-poll', 'before-agreement', 'before-record', 'after-record')
#: Longest wait for the write in flight when the process exits without finalizing.
EXIT_WAIT_SECONDS = 600.0


def kill_point(point, rank):
    """SIGKILL this process if :data:`kill_at` names ``point`` (and ``rank``, when it names one)."""
    want = kill_at
    if not want:
        return
    name, _, who = want.partition('@')
    if name == point and (not who or int(who) == int(rank)):
        os.kill(os.getpid(), signal.SIGKILL)


class Outcome:
    """What became of one save: its iteration, the bytes written, or why it failed."""

    __slots__ = ('iteration', 'size', 'error', 'seconds', 'finished')

    def __init__(self, iteration, size=None, error=None, seconds=0.0, finished=True):
        self.iteration = iteration
        self.size = size
        self.error = error
        self.seconds = seconds
        self.finished = finished

    @property
    def ok(self):
        return self.finished and self.error is None

    def why(self):
        """Return a short text: why the save failed (empty when it did not)."""
        if not self.finished:
            return 'its write had not finished after {:.0f} s'.format(self.seconds)
        if self.error is None:
            return ''
        return '{}: {}'.format(type(self.error).__name__, self.error)


#: Niceness the writer thread adds to its own (Linux: per thread), so training keeps the CPUs.
WRITER_NICENESS = 10
#: A staged write is spread over this part of the time between the two saves before it (the
#: time since the checkpointer was made, for its first save): the next save should find it done.
SPREAD = 0.75
#: The longest a write is spread over (a snapshot is durable this long after its save, at most,
#: when the disk is fast enough).
MAX_SPREAD_SECONDS = 10.0

_LIVE = weakref.WeakSet()


def _lower_priority():
    """Lower the calling thread's CPU priority (where the system lets a thread do so).

    Return ``(thread id, niceness before)`` (for :class:`_Paced`), or None.
    """
    try:
        tid = threading.get_native_id()
        before = os.getpriority(os.PRIO_PROCESS, tid)
        os.setpriority(os.PRIO_PROCESS, tid, min(19, before + WRITER_NICENESS))
        return tid, before
    except (AttributeError, OSError):
        return None


class _Paced:
    """The writer's file: its writes keep to the flight's pace until training waits for the write.

    Then the thread also gets its niceness back (the rank does nothing else then; raising a priority
    needs privileges an ordinary user may lack, and then the write goes on as it was).
    """

    def __init__(self, f, flight):
        self._f = f
        self._flight = flight

    def write(self, data):
        flight = self._flight
        flight._keep_pace()
        if flight._hurry and flight._lowered is not None:
            lowered, flight._lowered = flight._lowered, None
            try:
                os.setpriority(os.PRIO_PROCESS, *lowered)   # this thread's own id
            except OSError:
                pass
        n = self._f.write(data)
        flight._written += len(data) if n is None else n
        return n

    def __getattr__(self, name):
        return getattr(self._f, name)


def join_others(flight, timeout):
    """Wait (bounded) for every write in flight of this process but ``flight``'s, not collecting them.

    A load waits so: a snapshot this process saved through another checkpointer is on disk first.
    """
    for other in list(_LIVE):
        if other is not flight:
            other.join(timeout)


@atexit.register
def _wait_at_exit():
    for flight in list(_LIVE):
        flight.wait(EXIT_WAIT_SECONDS)


class InFlight:
    """At most one background write; :meth:`start` it, :meth:`wait` for it (bounded)."""

    def __init__(self):
        self._thread = None
        self._outcome = None
        self._iteration = None
        self._started = None
        self._lowered = None   # (thread id, niceness before) of the writer thread
        self._hurry = False    # training waits for the write in flight
        self._hurried = threading.Event()   # the same, for a paced write to stop waiting
        self._made = time.monotonic()
        self._pace = None      # (bytes, seconds): the write in flight is spread so
        self._written = 0
        #: An old generation's file set aside for the next write to write over (or None).
        self.spare = None
        _LIVE.add(self)

    @property
    def busy(self):
        """Whether a write was started and its outcome not collected yet."""
        return self._thread is not None

    @property
    def running(self):
        """Whether the write's thread is still running."""
        return self._thread is not None and self._thread.is_alive()

    def start(self, iteration, write, nbytes=None):
        """Run ``write()`` (returns the bytes written) on a new thread; one write at a time.

        ``nbytes``: the bytes the write will write through :meth:`file`, which spreads them (see
        :data:`SPREAD`); None: at full speed.
        """
        if self._thread is not None:
            raise RuntimeError('a snapshot write is already in flight; wait for it first')
        now = time.monotonic()
        since = now - (self._made if self._started is None else self._started)
        self._pace = (nbytes, min(SPREAD * since, MAX_SPREAD_SECONDS)) if nbytes else None
        self._written = 0
        self._iteration = iteration
        self._outcome = None
        self._started = now
        self._lowered, self._hurry = None, False
        self._hurried.clear()

        def run():
            self._lowered = _lower_priority()
            start = time.monotonic()
            try:
                size = write()
            except BaseException as e:   # reported by whoever waits; never lost
                self._outcome = Outcome(iteration, error=e, seconds=time.monotonic() - start)
            else:
                self._outcome = Outcome(iteration, size=size, seconds=time.monotonic() - start)

        self._thread = threading.Thread(target=run, name='chainermn-checkpoint-writer', daemon=True)
        self._thread.start()

    def file(self, f):
        """Return ``f`` as the write's file: paced, until training waits (see :class:`_Paced`)."""
        return _Paced(f, self)

    def _keep_pace(self):
        """Wait until the write in flight is due to write its next byte (or training waits)."""
        if self._pace is None or self._hurry:
            return
        nbytes, seconds = self._pace
        delay = self._started + seconds * min(1.0, self._written / nbytes) - time.monotonic()
        if delay > 0:
            self._hurried.wait(delay)

    def _hurry_up(self):
        self._hurry = True
        self._hurried.set()

    def join(self, timeout):
        """Wait (bounded) for the write in flight to end; its outcome stays for :meth:`wait`."""
        thread = self._thread
        if thread is not None:
            self._hurry_up()
            thread.join(timeout)

    def wait(self, timeout):
        """Return the :class:`Outcome` of the write in flight (None when there is none).

        A write still running after ``timeout`` seconds gives an outcome that is not finished;
        it stays in flight and the next wait waits for it again.
        """
        thread = self._thread
        if thread is None:
            return None
        self._hurry_up()
        thread.join(timeout)
        if thread.is_alive():
            return Outcome(self._iteration, seconds=time.monotonic() - self._started, finished=False)
        self._thread = None
        return self._outcome
