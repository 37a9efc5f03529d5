"""Per-call bookkeeping for communicators: the watchdog and the debug-mode consistency check.

Every blocking call of a communicator runs inside ``with guard(name, sig, **info):``.
``sig`` is a tuple of ``(key, value)`` pairs all ranks must agree on in debug mode (shape, dtype, root);
``info`` is only shown in reports (e.g. the peer of a send).
"""

import faulthandler
import os
import sys
import threading
import time
import weakref

from chainermn_comm._errors import CommunicationError

__all__ = ['CallGuard', 'TIMEOUT_ENV', 'DEBUG_ENV', 'DEFAULT_TIMEOUT', 'WATCHDOG_EXIT_STATUS',
           'resolve_timeout', 'debug_enabled']

TIMEOUT_ENV = 'CHAINERMN_TIMEOUT'
DEBUG_ENV = 'CHAINERMN_DEBUG'
#: Default watchdog timeout in seconds (30 minutes).
DEFAULT_TIMEOUT = 1800.0
#: Exit status of a job aborted by the watchdog.
WATCHDOG_EXIT_STATUS = 14


def resolve_timeout(timeout):
    """Return the watchdog timeout in seconds: argument, else $CHAINERMN_TIMEOUT, else default; 0 is off."""
    if timeout is None:
        env = os.environ.get(TIMEOUT_ENV, '').strip()
        if env:
            try:
                timeout = float(env)
            except ValueError:
                raise ValueError('{}={!r} must be a number of seconds (0 turns the watchdog off)'.format(
                    TIMEOUT_ENV, env))
        else:
            timeout = DEFAULT_TIMEOUT
    timeout = float(timeout)
    if timeout < 0:
        raise ValueError('timeout must be >= 0 seconds (0 turns the watchdog off); got {}'.format(timeout))
    return timeout


def debug_enabled():
    """Return True when $CHAINERMN_DEBUG asks for the cross-rank consistency checks."""
    return os.environ.get(DEBUG_ENV, '').strip().lower() not in ('', '0', 'false', 'no', 'off')


class _Watchdog(threading.Thread):
    """Daemon thread that aborts the job when a guarded call outlives its timeout."""

    def __init__(self):
        super().__init__(name='chainermn-watchdog', daemon=True)
        self._guards = weakref.WeakSet()
        self._lock = threading.Lock()
        self._wake = threading.Event()

    def add(self, guard):
        with self._lock:
            self._guards.add(guard)
        self._wake.set()

    def run(self):
        while True:
            with self._lock:
                guards = list(self._guards)
            now = time.monotonic()
            wait = 5.0
            for g in guards:
                cur = g.current
                if cur is None or g.timeout <= 0:
                    if g.timeout > 0:
                        wait = min(wait, g.timeout / 4.0)
                    continue
                elapsed = now - cur[3]
                if elapsed >= g.timeout:
                    g.fire(cur, elapsed)
                wait = min(wait, max(0.05, min(g.timeout - elapsed, g.timeout / 4.0)))
            self._wake.wait(max(0.05, min(wait, 1.0)))
            self._wake.clear()


_watchdog = None
_watchdog_lock = threading.Lock()


def _ensure_watchdog(guard):
    global _watchdog
    with _watchdog_lock:
        if _watchdog is None:
            _watchdog = _Watchdog()
            _watchdog.start()
    _watchdog.add(guard)


class CallGuard:
    """Time-stamp each blocking call for the watchdog and, in debug mode, check ranks agree."""

    def __init__(self, mpi_comm, timeout=None, debug=None):
        self.rank = mpi_comm.Get_rank()
        self.size = mpi_comm.Get_size()
        self.timeout = resolve_timeout(timeout)
        self.debug = debug_enabled() if debug is None else bool(debug)
        self.seq = 0
        self.current = None
        self._name = None
        self._sig = ()
        self._info = None
        self._debug_comm = mpi_comm.Dup() if self.debug else None
        if self.timeout > 0:
            _ensure_watchdog(self)

    def __call__(self, name, sig=(), collective=True, **info):
        self._name = name
        self._sig = sig
        self._info = info
        if self.debug and collective:
            self._check_agreement(name, sig)
        return self

    def __enter__(self):
        self.seq += 1
        self.current = (self._name, self.seq, self._sig, time.monotonic(), self._info)
        return self

    def __exit__(self, *exc):
        self.current = None
        return False

    def _check_agreement(self, name, sig):
        """Raise CommunicationError on every rank unless all ranks make the same call."""
        mine = (name,) + tuple(sig)
        everyone = self._debug_comm.allgather(mine)
        if all(e == everyone[0] for e in everyone):
            return
        lines = ['  rank {}: {}'.format(r, _fmt_call(e[0], e[1:])) for r, e in enumerate(everyone)]
        raise CommunicationError(
            'rank {}: ranks disagree on collective call #{} (CHAINERMN_DEBUG=1):\n{}\n'
            'Every rank must make the same collective calls in the same order with compatible '
            'shapes and dtypes.'.format(self.rank, self.seq + 1, '\n'.join(lines)))

    def fire(self, cur, elapsed):
        """Report the stuck call with every thread's stack and abort the whole job."""
        name, seq, sig, _, info = cur
        details = _fmt_call(name, sig)
        if info:
            details += ' ' + ', '.join('{}={}'.format(k, v) for k, v in sorted(info.items()))
        try:
            sys.stderr.write(
                '\n*** chainermn watchdog: rank {} of {}: call #{} {} has been blocked for {:.1f} s '
                '(timeout {:g} s, set by {} or create_communicator(timeout=...)). '
                'Stacks of all threads follow; aborting the job with MPI_Abort({}).\n'.format(
                    self.rank, self.size, seq, details, elapsed, self.timeout, TIMEOUT_ENV,
                    WATCHDOG_EXIT_STATUS))
            sys.stderr.flush()
            faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
            sys.stderr.flush()
        finally:
            from mpi4py import MPI
            MPI.COMM_WORLD.Abort(WATCHDOG_EXIT_STATUS)


def _fmt_call(name, sig):
    if not sig:
        return '{}()'.format(name)
    return '{}({})'.format(name, ', '.join('{}={}'.format(k, v) for k, v in sig))
