"""Per-call bookkeeping for communicators: the watchdog and the debug-mode consistency check.

Every blocking call of a communicator runs inside ``with guard(name, sig, collective=..., **info):``.
``sig`` is a tuple of ``(key, value)`` pairs all ranks must agree on in debug mode (shape, dtype, root),
or a callable returning one (for signatures that cost time to build, built only when needed);
``info`` is only shown in reports (e.g. the peer of a send).

Fast path (watchdog on, debug off): entering a call stores one tuple with a ``time.monotonic()``
stamp; leaving it clears the tuple.  A single daemon thread per process wakes at most once a second
(or every quarter of the timeout), and aborts the job when a call has been running too long.
"""

import atexit
import faulthandler
import os
import sys
import threading
import time
import weakref

from chainermn_comm._errors import CommunicationError

__all__ = ['CallGuard', 'TIMEOUT_ENV', 'DEBUG_ENV', 'DEFAULT_TIMEOUT', 'WATCHDOG_EXIT_STATUS',
           'EXIT_CALL', 'resolve_timeout', 'debug_enabled']

TIMEOUT_ENV = 'CHAINERMN_TIMEOUT'
DEBUG_ENV = 'CHAINERMN_DEBUG'
#: Default watchdog timeout in seconds (30 minutes).
DEFAULT_TIMEOUT = 1800.0
#: Exit status of a job aborted by the watchdog.
WATCHDOG_EXIT_STATUS = 14
#: Name a rank reports in the debug-mode check when its program is exiting.
EXIT_CALL = '<program exit>'

_MAX_VALUE_CHARS = 160
#: Seconds between the watchdog's report and MPI_Abort.
_ABORT_GRACE = 1.0


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
    if not timeout >= 0:
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
            wait = 1.0
            for g in guards:
                if g.timeout <= 0:
                    continue
                cur = g.current
                if cur is None:
                    wait = min(wait, g.timeout / 4.0)
                    continue
                elapsed = now - cur[3]
                if elapsed >= g.timeout:
                    g.fire(cur, elapsed)
                wait = min(wait, g.timeout - elapsed, g.timeout / 4.0)
            del guards
            self._wake.wait(max(0.02, wait))
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


#: Debug-mode guards on the whole job, in creation order; checked once more at program exit.
_exit_checked = []
_exit_hook_lock = threading.Lock()
_exit_hook_installed = [False]


def _register_exit_check(guard):
    with _exit_hook_lock:
        _exit_checked.append(weakref.ref(guard))
        if not _exit_hook_installed[0]:
            # Registered after mpi4py's own MPI_Finalize hook, so it runs before it (LIFO).
            atexit.register(_check_at_exit)
            _exit_hook_installed[0] = True


def _check_at_exit():
    """Meet the other ranks' pending collectives with a '<program exit>' call (debug mode)."""
    try:
        from mpi4py import MPI
        if not MPI.Is_initialized() or MPI.Is_finalized():
            return
    except Exception:
        return
    for ref in list(_exit_checked):
        guard = ref()
        if guard is None or guard._debug_comm is None or guard._desynced:
            continue
        try:
            with guard(EXIT_CALL, ()):
                pass
        except CommunicationError as e:
            sys.stderr.write('\n{}\n'.format(e))
            sys.stderr.flush()
            break
        except Exception:
            break


class CallGuard:
    """Time-stamp each blocking call for the watchdog and, in debug mode, check ranks agree."""

    def __init__(self, mpi_comm, timeout=None, debug=None):
        self.rank = mpi_comm.Get_rank()
        self.size = mpi_comm.Get_size()
        self.timeout = resolve_timeout(timeout)
        self.debug = debug_enabled() if debug is None else bool(debug)
        #: Number of guarded calls entered so far (point-to-point and collective).
        self.seq = 0
        #: Number of collective calls entered so far.
        self.collective_seq = 0
        #: ``(name, seq, sig, start, info)`` of the call in progress, or None.
        self.current = None
        #: The last call that completed (same layout as ``current``), or None.
        self.last = None
        self._name = None
        self._sig = ()
        self._info = None
        self._collective = True
        self._in_check = False
        self._desynced = False
        self._debug_comm = None
        if self.debug:
            self._debug_comm = mpi_comm.Dup()
            from mpi4py import MPI
            if MPI.Comm.Compare(mpi_comm, MPI.COMM_WORLD) in (MPI.IDENT, MPI.CONGRUENT):
                _register_exit_check(self)
        if self.timeout > 0:
            _ensure_watchdog(self)

    def __call__(self, name, sig=(), collective=True, **info):
        self._name = name
        self._sig = sig
        self._info = info
        self._collective = collective
        return self

    def __enter__(self):
        self.seq += 1
        collective = self._collective
        if collective:
            self.collective_seq += 1
        cur = self.current = (self._name, self.seq, self._sig, time.monotonic(), self._info)
        if collective and self._debug_comm is not None:
            self._in_check = True
            try:
                self._check_agreement(cur)
            except BaseException:
                self.current = None
                raise
            finally:
                self._in_check = False
        return self

    def __exit__(self, *exc):
        self.last = self.current
        self.current = None
        return False

    def _check_agreement(self, cur):
        """Raise CommunicationError on every rank unless all ranks make the same call."""
        name, _, sig, _, _ = cur
        mine = (name, tuple(_resolve(sig)), self.collective_seq)
        everyone = self._debug_comm.allgather(mine)
        if all(e[:2] == everyone[0][:2] for e in everyone):
            return
        # Every rank sees the same mismatch: the ranks are out of step on this communicator,
        # so the check at program exit must not wait for a partner.
        self._desynced = True
        lines = []
        for r, (n, s, c) in enumerate(everyone):
            what = 'exiting (its program finished or failed)' if n == EXIT_CALL else \
                'collective call #{}: {}'.format(c, _fmt_call(n, s))
            lines.append('  rank {}: {}{}'.format(r, what, '   <- this rank' if r == self.rank else ''))
        raise CommunicationError(
            'rank {}: ranks disagree on the next collective call (CHAINERMN_DEBUG=1):\n{}\n{}'
            'Every rank must make the same collective calls in the same order with the same '
            'shapes and dtypes (e.g. a parameter without a gradient on one rank, or one rank '
            'running an extra iteration).'.format(
                self.rank, '\n'.join(lines), _first_difference(everyone)))

    def describe(self, cur):
        """Return a one-line description of the call ``cur``: name, sequence number, sig and info."""
        name, seq, sig, _, info = cur
        details = 'call #{} {}'.format(seq, _fmt_call(name, _resolve(sig)))
        if info:
            details += ' [' + ', '.join('{}={}'.format(k, _short(v)) for k, v in sorted(info.items())) + ']'
        return details

    def fire(self, cur, elapsed):
        """Report the stuck call with every thread's stack and abort the whole job."""
        try:
            last = 'none' if self.last is None else self.describe(self.last)
            checking = ''
            if self._in_check and cur[0] != EXIT_CALL:
                checking = ' (in the CHAINERMN_DEBUG agreement check before it)'
            sys.stderr.write(
                '\n*** chainermn watchdog: rank {} of {}: {}{} has been blocked for {:.1f} s '
                '(timeout {:g} s, set by ${} or create_communicator(timeout=...)).\n'
                '*** last completed call on this rank: {}\n'
                '*** Another rank probably died, skipped this call or is making a different one. '
                'Stacks of all threads follow; aborting the job with MPI_Abort({}).\n'.format(
                    self.rank, self.size, self.describe(cur), checking, elapsed, self.timeout,
                    TIMEOUT_ENV, last, WATCHDOG_EXIT_STATUS))
            sys.stderr.flush()
            faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
            sys.stderr.flush()
        except Exception:
            pass
        finally:
            try:
                # The other ranks' watchdogs usually fire at the same moment: give their reports
                # time to reach the terminal before this abort kills them.
                time.sleep(_ABORT_GRACE)
                from mpi4py import MPI
                MPI.COMM_WORLD.Abort(WATCHDOG_EXIT_STATUS)
            finally:
                os._exit(WATCHDOG_EXIT_STATUS)


def _short(value):
    text = str(value)
    if len(text) > _MAX_VALUE_CHARS:
        text = text[:_MAX_VALUE_CHARS - 20] + '...<{} chars>'.format(len(text))
    return text


def _resolve(sig):
    """Return ``sig``, calling it first when it is given lazily (a callable)."""
    return sig() if callable(sig) else sig


def _fmt_call(name, sig):
    if not sig:
        return '{}()'.format(name)
    return '{}({})'.format(name, ', '.join('{}={}'.format(k, _short(v)) for k, v in sig))


def _first_difference(everyone):
    """Return a line naming the first sig entry on which two ranks differ, or ''."""
    ref_rank, (ref_name, ref_sig, _) = 0, everyone[0]
    for r, (name, sig, _) in enumerate(everyone):
        if name != ref_name:
            continue
        a, b = dict(ref_sig), dict(sig)
        for key in list(a) + [k for k in b if k not in a]:
            va, vb = a.get(key), b.get(key)
            if va == vb:
                continue
            if isinstance(va, tuple) and isinstance(vb, tuple) and key == 'params':
                if len(va) != len(vb):
                    return ('First difference: {} has {} arrays on rank {} but {} on rank {} '
                            '(does a parameter have no gradient on one rank? use zero_fill=True).\n'.format(
                                key, len(va), ref_rank, len(vb), r))
                i = next(i for i, (x, y) in enumerate(zip(va, vb)) if x != y)
                return 'First difference: {}[{}] is {} on rank {} but {} on rank {}.\n'.format(
                    key, i, va[i], ref_rank, vb[i], r)
            return 'First difference: {} is {} on rank {} but {} on rank {}.\n'.format(
                key, _short(va), ref_rank, _short(vb), r)
    return ''
