"""Watch queued NCCL work from a background thread, so that callers never wait for it.

After each NCCL call the caller records an event on the call's stream and hands it to the
process's :class:`NcclWatchdog`; the call then returns at once and later kernels on the same
stream run after it, as CUDA orders them.  The watchdog's thread polls every outstanding
event: finished ones are dropped; when NCCL reports an asynchronous error (a peer died), or
an event is still pending after its limit (a peer hangs), it calls the entry's ``fail``
(which aborts the NCCL communicator, so kernels stuck in it return, and makes the group's
next call raise), and prints once which rank and which call failed.  With nothing
outstanding the thread sleeps on a condition and costs nothing.
"""

import collections
import threading
import time

from chainermn_comm.log import get_logger

__all__ = ['NcclWatchdog', 'watchdog', 'POLL_SECONDS']

#: Seconds between two polls of outstanding NCCL work.
POLL_SECONDS = 1e-3

_Entry = collections.namedtuple('_Entry', ['key', 'event', 'what', 'start', 'limit', 'poll_error', 'fail'])


class NcclWatchdog:
    """One daemon thread that watches recorded events of NCCL calls until they finish."""

    def __init__(self, poll=POLL_SECONDS, stream=None):
        """``stream``: where failures are printed (None: the ``chainermn.nccl`` logger)."""
        self.poll = poll
        self._cond = threading.Condition()
        self._pending = collections.deque()
        self._thread = None
        self._out = stream  # None: the chainermn logger
        self._failed = []  # keys already failed: their later calls are dropped, not failed again
        self.failures = []  # (what, message) of every failure seen, for reports and tests

    def watch(self, key, event, what, limit, poll_error, fail):
        """Watch ``event`` (recorded after the NCCL call ``what``) without blocking the caller.

        ``key`` identifies the NCCL communicator; ``poll_error()`` raises on an asynchronous
        NCCL error; ``fail(what, error)`` is called once, from the watchdog's thread, on an
        error or when the event is not done within ``limit`` seconds (no limit when <= 0).
        """
        with self._cond:
            self._pending.append(_Entry(key, event, what, time.monotonic(), limit, poll_error, fail))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name='chainermn-nccl-watchdog',
                                                daemon=True)
                self._thread.start()
            self._cond.notify()

    def outstanding(self):
        """Return how many NCCL calls are still being watched."""
        with self._cond:
            return len(self._pending)

    def forget(self, key):
        """Stop watching the calls of the NCCL communicator ``key`` (it was destroyed)."""
        with self._cond:
            self._pending = collections.deque(e for e in self._pending if e.key is not key)
            self._failed = [k for k in self._failed if k is not key]

    def _run(self):
        while True:
            with self._cond:
                while not self._pending:
                    self._cond.wait()
                entries = list(self._pending)
                failed = list(self._failed)
            finished = self._check(entries, failed)
            with self._cond:
                drop = set(map(id, finished))
                self._failed.extend(k for k in failed if not any(k is f for f in self._failed))
                self._pending = collections.deque(
                    e for e in self._pending
                    if id(e) not in drop and not any(e.key is k for k in self._failed))
                if not self._pending:
                    continue
            time.sleep(self.poll)

    def _check(self, entries, failed):
        """Return the finished entries; append the key of each newly failed group to ``failed``."""
        finished = []
        for e in entries:
            if any(e.key is k for k in failed):
                continue
            try:
                if e.event.done:
                    finished.append(e)
                    continue
                e.poll_error()
            except Exception as err:  # NCCL's asynchronous error
                self._fail(e, err)
                failed.append(e.key)
                continue
            if e.limit > 0 and time.monotonic() - e.start > e.limit:
                self._fail(e, TimeoutError('NCCL {} did not complete within {:.1f} s'.format(
                    e.what, e.limit)))
                failed.append(e.key)
        return finished

    def _fail(self, entry, err):
        try:
            message = entry.fail(entry.what, err)
        except Exception as e:  # the report must not die with the thread
            message = 'NCCL {} failed: {} (and reporting it raised {!r})'.format(entry.what, err, e)
        self.failures.append((entry.what, message))
        if self._out is None:
            get_logger('nccl').error('%s', message)
        else:
            print('chainermn: {}'.format(message), file=self._out, flush=True)


_WATCHDOG = None
_LOCK = threading.Lock()


def watchdog():
    """Return the process's NCCL watchdog (created on first use)."""
    global _WATCHDOG
    with _LOCK:
        if _WATCHDOG is None:
            _WATCHDOG = NcclWatchdog()
        return _WATCHDOG
