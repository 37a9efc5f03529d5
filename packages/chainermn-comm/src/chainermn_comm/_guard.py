"""Per-call bookkeeping for communicators: agreement checks, the stall inspector and the watchdog.

Every blocking call of a communicator runs inside ``with guard(name, sig, collective=..., key=..., **info):``.
``sig`` is a tuple of ``(key, value)`` pairs all ranks must agree on (shape, dtype, root, parameter
list), or a callable returning one (for signatures that cost time to build, built only when needed);
``key`` is an optional cheap stand-in for ``sig`` made of ints and tuples only (hashed the same way
in every process); ``info`` is only shown in reports (e.g. the peer of a send).

Default mode (``$CHAINERMN_CHECK`` unset or 1): entering a collective exchanges a 62-bit
fingerprint ``fp`` of ``(name, key or sig)``.  On communicators of up to ``GATHER_MAX_RANKS``
ranks every rank all-gathers a fixed 72-byte record, ``fp`` plus up to ``PAYLOAD_BYTES`` of the
call's own data: a small all-reduce hands its array in (``payload=``), finds every rank's array in
:attr:`CallGuard.payload` after the check and reduces them locally in rank order, so it costs one
message, not two.  On larger communicators it all-reduces ``[fp, -fp]`` with ``MPI.MAX``.  Either
way every rank learns whether all agree.  Only when they do not, the ranks gather their full
signatures and raise :class:`CommunicationError` naming the ranks, hosts and the first difference.

Debug mode (``$CHAINERMN_DEBUG=1``): the full signatures are gathered at every collective instead.

Watchdog and stall inspector: a single daemon thread per process (see :mod:`chainermn_comm._stall`)
reports a call that has waited ``$CHAINERMN_STALL_SECONDS`` (which ranks have not reached it, asked
over a side communicator) and aborts the job when a call outlives ``$CHAINERMN_TIMEOUT``.
"""

import array
import atexit
import contextlib
import faulthandler
import operator
import os
import sys
import threading
import time
import weakref
import zlib

from chainermn_comm import _stall
from chainermn_comm._errors import CommunicationError

__all__ = ['CallGuard', 'TIMEOUT_ENV', 'DEBUG_ENV', 'CHECK_ENV', 'STALL_ENV', 'DEFAULT_TIMEOUT',
           'DEFAULT_STALL_SECONDS', 'WATCHDOG_EXIT_STATUS', 'EXIT_CALL', 'resolve_timeout',
           'resolve_stall_seconds', 'debug_enabled', 'check_enabled', 'stable_code', 'fail_together',
           'INVALID_INPUT', 'number_from_env', 'GATHER_MAX_RANKS', 'PAYLOAD_BYTES', 'guarded_call']

TIMEOUT_ENV = 'CHAINERMN_TIMEOUT'
DEBUG_ENV = 'CHAINERMN_DEBUG'
#: Set to 0 to turn off the default-mode agreement check of collective calls.
CHECK_ENV = 'CHAINERMN_CHECK'
#: Seconds a call may wait before the stall inspector reports it (0 turns the inspector off).
STALL_ENV = 'CHAINERMN_STALL_SECONDS'
#: Default watchdog timeout in seconds (30 minutes).
DEFAULT_TIMEOUT = 1800.0
#: Default stall report threshold in seconds.
DEFAULT_STALL_SECONDS = 60.0
#: Exit status of a job aborted by the watchdog.
WATCHDOG_EXIT_STATUS = 14
#: Name a rank reports in the debug-mode check when its program is exiting.
EXIT_CALL = '<program exit>'

_MAX_VALUE_CHARS = 160
#: Seconds between the watchdog's report and MPI_Abort.
_ABORT_GRACE = 1.0
#: Seconds between two rounds of answering the other ranks' progress queries.
_SERVE_PERIOD = 1.0
_FP_MASK = (1 << 62) - 1
#: Largest communicator whose check all-gathers a record (fingerprint + small payload).
GATHER_MAX_RANKS = 64
#: Bytes of a call's data that ride in the check's record.
PAYLOAD_BYTES = 64
_REC_WORDS = 1 + PAYLOAD_BYTES // 8
#: Signature key of a call whose arguments are invalid on this rank (the value says why).
INVALID_INPUT = 'invalid input'
_OFF = ('', '0', 'false', 'no', 'off')


def number_from_env(name, default, convert=float, what='a number of seconds'):
    """Return $name converted by ``convert``, or ``default`` when unset; ValueError naming it otherwise."""
    env = os.environ.get(name, '').strip()
    if not env:
        return default
    try:
        return convert(env)
    except ValueError:
        raise ValueError('{}={!r} must be {}'.format(name, env, what)) from None


def resolve_timeout(timeout):
    """Return the watchdog timeout in seconds: argument, else $CHAINERMN_TIMEOUT, else default; 0 is off."""
    if timeout is None:
        timeout = number_from_env(TIMEOUT_ENV, DEFAULT_TIMEOUT,
                                  what='a number of seconds (0 turns the watchdog off)')
    timeout = float(timeout)
    if not timeout >= 0:
        raise ValueError('timeout must be >= 0 seconds (0 turns the watchdog off); got {}'.format(timeout))
    return timeout


def resolve_stall_seconds():
    """Return the stall report threshold: $CHAINERMN_STALL_SECONDS, else 60; 0 is off."""
    value = number_from_env(STALL_ENV, DEFAULT_STALL_SECONDS,
                            what='a number of seconds (0 turns the stall inspector off)')
    if not value >= 0:
        raise ValueError('{}={} must be >= 0 seconds (0 turns the stall inspector off)'.format(
            STALL_ENV, value))
    return value


def debug_enabled():
    """Return True when $CHAINERMN_DEBUG asks for the full cross-rank consistency checks."""
    return os.environ.get(DEBUG_ENV, '').strip().lower() not in _OFF


def check_enabled():
    """Return True unless $CHAINERMN_CHECK=0 turns off the default-mode agreement check."""
    return os.environ.get(CHECK_ENV, '1').strip().lower() not in _OFF[1:]


_codes = {}


def stable_code(value):
    """Return a process-independent int for ``value`` (a str, or anything with a stable ``str``)."""
    try:
        code = _codes.get(value)
    except TypeError:  # unhashable
        return zlib.crc32(str(value).encode('utf-8', 'replace'))
    if code is None:
        code = _codes[value] = zlib.crc32(str(value).encode('utf-8', 'replace'))
    return code


def _stable_key(value):
    """Turn a signature into ints and tuples, whose ``hash`` is the same in every process."""
    if isinstance(value, (tuple, list)):
        return tuple(_stable_key(v) for v in value)
    if isinstance(value, float):
        return stable_code(repr(value))
    try:
        return operator.index(value)  # int, bool, numpy integers
    except TypeError:
        return stable_code(value)


def fail_together(comm, name, error):
    """Raise ``error`` here and a CommunicationError on the ranks that are in collective ``name``.

    For a rank that finds its own input invalid where the other ranks enter a collective call:
    it joins the agreement check with an 'invalid input' signature instead, so that no rank is
    left waiting.  Without the check (one rank, $CHAINERMN_CHECK=0) it just raises ``error``.
    """
    guard = getattr(comm, '_guard', None)
    if not isinstance(guard, CallGuard) or not (guard.check or guard.debug):
        raise error
    with guard(name, ((INVALID_INPUT, '{}: {}'.format(type(error).__name__, error)),)):
        pass
    raise error


def guarded_call(comm, name, sig=(), key=None):
    """Return the guard of blocking call ``name`` on ChainerMN communicator ``comm`` (agreement
    check, stall report, watchdog), or a context that does nothing for any other ``comm`` (e.g.
    an mpi4py communicator)."""
    guard = getattr(comm, '_guard', None)
    if guard is None or not callable(guard):
        return contextlib.nullcontext()
    return guard(name, sig, key=key)


class _Watchdog(threading.Thread):
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
            wait = _SERVE_PERIOD
            for g in guards:
                try:
                    wait = min(wait, g.tick(now, self))
                except Exception as e:  # never let the thread die: it guards the whole job
                    try:
                        sys.stderr.write('chainermn watchdog: {}: {}\n'.format(type(e).__name__, e))
                    except Exception:
                        pass
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
            # Registered after mpi4py's MPI_Finalize hook, so it runs before it (LIFO).
            atexit.register(_watchdog.close)
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
    """Check that ranks agree on each collective call, report stalls and abort calls that hang."""

    def __init__(self, mpi_comm, timeout=None, debug=None, check=None):
        from mpi4py import MPI
        self.rank = mpi_comm.Get_rank()
        self.size = mpi_comm.Get_size()
        self.timeout = resolve_timeout(timeout)
        self.stall_seconds = resolve_stall_seconds()
        self.debug = debug_enabled() if debug is None else bool(debug)
        #: Whether collectives all-reduce a fingerprint header first (default mode).
        self.check = (check_enabled() if check is None else bool(check)) and not self.debug \
            and self.size > 1
        self.host = MPI.Get_processor_name()
        #: Every rank's payload bytes, ``(size, nbytes)``, after a checked call given ``payload=``
        #: (None when the call was not fused with the check); read it with :meth:`take_payload`.
        self.payload = None
        self._payload_in = None
        self._rec = self._gathered = None
        if self.check and self.size <= GATHER_MAX_RANKS:
            import numpy
            self._rec = numpy.zeros(_REC_WORDS, numpy.int64)
            self._rec_bytes = self._rec.view(numpy.uint8)
            self._gathered = numpy.zeros((self.size, _REC_WORDS), numpy.int64)
            self._gathered_fp = self._gathered[:, 0]
            self._gathered_bytes = self._gathered.view(numpy.uint8)
            self._views = {}  # (dtype, shape) -> (view of my record, views of every rank's record)
        #: Number of guarded calls entered so far (point-to-point and collective).
        self.seq = 0
        #: Number of collective calls entered so far.
        self.collective_seq = 0
        #: ``(name, seq, sig, start, info, collective number or 0)`` of the call in progress, or None.
        self.current = None
        #: The last call that completed (same layout as ``current``), or None.
        self.last = None
        self._mpi_comm = mpi_comm
        self._name = None
        self._sig = ()
        self._key = None
        self._info = None
        self._collective = True
        self._in_check = False
        self._desynced = False
        self._debug_comm = None
        # array.array: item access costs a fraction of NumPy's on this per-call path.
        self._header = array.array('q', [0, 0])
        self._max = MPI.MAX
        self._in_place = MPI.IN_PLACE
        self._side = None
        self._side_why = ''
        self._last_serve = 0.0
        self._stall_reported = None
        if self.debug:
            self._debug_comm = mpi_comm.Dup()
            if MPI.Comm.Compare(mpi_comm, MPI.COMM_WORLD) in (MPI.IDENT, MPI.CONGRUENT):
                _register_exit_check(self)
        if self.stall_seconds > 0 and self.size > 1:
            ok, self._side_why = _stall.side_channel_available()
            if ok:
                self._side = _stall.SideChannel(mpi_comm)
        if self.timeout > 0 or self._side is not None:
            _ensure_watchdog(self)

    def close(self):
        """Stop the stall inspector's side channel of this guard (call before freeing the communicator)."""
        side, self._side = self._side, None
        if side is None:
            return
        lock = _watchdog.mpi_lock if _watchdog is not None else threading.Lock()
        with lock:
            try:
                from mpi4py import MPI
                if not MPI.Is_finalized():
                    side.comm.Free()
            except Exception:
                pass

    def __call__(self, name, sig=(), collective=True, key=None, payload=None, **info):
        """Describe the next call; ``payload``: a C-contiguous host array of at most
        ``PAYLOAD_BYTES`` to all-gather with the check (same size on every rank that agrees)."""
        self._name = name
        self._sig = sig
        self._key = key
        self._info = info
        self._collective = collective
        self._payload_in = payload
        return self

    def take_payload(self):
        """Return every rank's payload gathered by the check (one array per rank, shaped and typed
        like the payload, in rank order; valid until the next call), or None."""
        rows, self.payload = self.payload, None
        return rows

    def _payload_views(self, payload):
        key = (payload.dtype, payload.shape)
        views = self._views.get(key)
        if views is None:
            n = payload.nbytes
            mine = self._rec_bytes[8:8 + n].view(payload.dtype).reshape(payload.shape)
            rows = [self._gathered_bytes[r, 8:8 + n].view(payload.dtype).reshape(payload.shape)
                    for r in range(self.size)]
            views = self._views[key] = (mine, rows)
            if len(self._views) > 64:
                self._views.clear()
                self._views[key] = views
        return views

    def __enter__(self):
        self.seq += 1
        number = 0
        if self._collective:
            self.collective_seq += 1
            number = self.collective_seq
        cur = self.current = (self._name, self.seq, self._sig, time.monotonic(), self._info, number)
        self.payload = None
        if number and (self.check or self._debug_comm is not None):
            self._in_check = True
            try:
                if self.check:
                    self._check_header(cur)
                else:
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
        self.payload = self._payload_in = None
        return False

    # -- default mode: one small all-reduce ------------------------------------------------
    def _check_header(self, cur):
        """Exchange the call's fingerprint; on disagreement gather the signatures and raise."""
        key = self._key
        if key is None:
            key = _stable_key(_comparable(_resolve(cur[2])))
        fp = hash((stable_code(cur[0]), key)) & _FP_MASK
        if self._rec is not None:
            self._check_gathered(cur, fp)
            return
        h = self._header
        h[0] = fp
        h[1] = -fp
        self._mpi_comm.Allreduce(self._in_place, h, self._max)
        if h[0] == fp and h[1] == -fp:
            return
        self._raise_disagreement(cur, self._mpi_comm, 'the next collective call')

    def _check_gathered(self, cur, fp):
        """All-gather ``[fp, payload]`` records; keep the payloads when every ``fp`` agrees."""
        payload, self._payload_in = self._payload_in, None
        self._rec[0] = fp
        views = None
        if payload is not None and payload.nbytes <= PAYLOAD_BYTES:
            views = self._payload_views(payload)
            views[0][...] = payload
        self._mpi_comm.Allgather(self._rec, self._gathered)
        if self._gathered_fp.tolist().count(fp) != self.size:
            self._raise_disagreement(cur, self._mpi_comm, 'the next collective call')
        if views is not None:
            self.payload = views[1]

    # -- debug mode: gather every signature -------------------------------------------------
    def _check_agreement(self, cur):
        """Raise CommunicationError on every rank unless all ranks make the same call."""
        everyone = self._gather_calls(cur, self._debug_comm)
        first = (everyone[0][0], _comparable(everyone[0][1]))
        if all((e[0], _comparable(e[1])) == first for e in everyone):
            return
        # Every rank sees the same mismatch: the ranks are out of step on this communicator,
        # so the check at program exit must not wait for a partner.
        self._desynced = True
        self._raise_from(everyone, 'the next collective call (CHAINERMN_DEBUG=1)')

    def _gather_calls(self, cur, comm):
        name, sig = cur[0], cur[2]
        return comm.allgather((name, tuple(_resolve(sig)), self.collective_seq, self.host))

    def _raise_disagreement(self, cur, comm, what):
        self._raise_from(self._gather_calls(cur, comm), what)

    def _raise_from(self, everyone, what):
        lines = []
        for r, (n, s, c, host) in enumerate(everyone):
            call = 'exiting (its program finished or failed)' if n == EXIT_CALL else \
                'collective call #{}: {}'.format(c, _fmt_call(n, s))
            lines.append('  rank {}: {} on host {}{}'.format(
                r, call, host, '   <- this rank' if r == self.rank else ''))
        raise CommunicationError(
            'rank {}: ranks disagree on {}:\n{}\n{}'
            'Every rank must make the same collective calls in the same order with the same '
            'shapes, dtypes, parameters and roots (e.g. a model built differently on one rank, a '
            'parameter without a gradient on one rank, or one rank running an extra iteration).'.format(
                self.rank, what, '\n'.join(lines), _first_difference(everyone)))

    # -- reports ------------------------------------------------------------------------
    def describe(self, cur):
        """Return a one-line description of the call ``cur``: name, sequence number, sig and info."""
        name, seq, sig, _, info = cur[:5]
        details = 'call #{} {}'.format(seq, _fmt_call(name, _resolve(sig)))
        if info:
            details += ' [' + ', '.join('{}={}'.format(k, _short(v)) for k, v in sorted(info.items())) + ']'
        return details

    def progress(self):
        """Return what this rank is doing, for another rank's stall report (watchdog thread)."""
        cur = self.current
        return {'host': self.host, 'collectives': self.collective_seq,
                'call': None if cur is None else self.describe(cur),
                'number': 0 if cur is None else cur[5]}

    def tick(self, now, watchdog):
        """Do this guard's watchdog work; return the seconds until it needs the thread again."""
        wait = _SERVE_PERIOD
        side = self._side
        if side is not None and (now - self._last_serve >= _SERVE_PERIOD or side.asking):
            with watchdog.mpi_lock:
                if watchdog.closed or self._side is not side or _mpi_finalized():
                    self._side = side = None  # program exit, close(), or MPI_Finalize called
                else:
                    side.serve(self.progress)
                    self._last_serve = now
        cur = self.current
        if cur is None:
            if side is not None and side.asking:
                side.cancel()
            return wait if self.timeout <= 0 else min(wait, self.timeout / 4.0)
        elapsed = now - cur[3]
        if self.timeout > 0:
            if elapsed >= self.timeout:
                self.fire(cur, elapsed)
            wait = min(wait, self.timeout - elapsed, self.timeout / 4.0)
        if self.stall_seconds > 0 and self._stall_reported is not cur:
            if elapsed < self.stall_seconds:
                return min(wait, self.stall_seconds - elapsed)
            if side is None:
                self._report_stall(cur, elapsed, None)
            elif not side.asking:
                with watchdog.mpi_lock:
                    if watchdog.closed or self._side is not side:
                        return wait
                    side.ask()
                return 0.1
            else:
                answers = side.answers_ready()
                if answers is None:
                    return 0.1
                self._report_stall(cur, elapsed, answers)
        return wait

    def _report_stall(self, cur, elapsed, answers):
        self._stall_reported = cur
        why = self._side_why or 'the stall inspector\'s side channel is closed'
        try:
            sys.stderr.write('\n' + _stall.format_stall_report(
                self.rank, self.size, self.host, self.describe(cur), elapsed, cur[5], answers,
                self.timeout, STALL_ENV, TIMEOUT_ENV, why))
            sys.stderr.flush()
        except Exception:
            pass

    def fire(self, cur, elapsed):
        """Report the stuck call with every thread's stack and abort the whole job."""
        try:
            last = 'none' if self.last is None else self.describe(self.last)
            checking = ''
            if self._in_check and self._debug_comm is not None and cur[0] != EXIT_CALL:
                checking = ' (in the agreement check before it)'
            sys.stderr.write(
                '\n*** chainermn watchdog: rank {} of {}: {}{} has been blocked for {:.1f} s '
                '(timeout {:g} s, set by ${} or create_communicator(timeout=...)) on host {}.\n'
                '*** last completed call on this rank: {}\n'
                '*** Another rank probably died, skipped this call or is making a different one. '
                'Stacks of all threads follow; aborting the job with MPI_Abort({}).\n'.format(
                    self.rank, self.size, self.describe(cur), checking, elapsed, self.timeout,
                    TIMEOUT_ENV, self.host, last, WATCHDOG_EXIT_STATUS))
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


def _comparable(sig):
    """Return ``sig`` as the ranks compare it: all 'invalid input' signatures are alike.

    When every rank's input is invalid, each raises its own error after the check.
    """
    if sig and sig[0][0] == INVALID_INPUT:
        return ((INVALID_INPUT, ''),)
    return sig


def _mpi_finalized():
    from mpi4py import MPI
    return MPI.Is_finalized()


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
    return '{}({})'.format(name, ', '.join('{}={}'.format(k, _fmt_value(k, v)) for k, v in sig))


def _fmt_value(key, value):
    if key == INVALID_INPUT:
        return '<see below>'
    if key == 'params' and isinstance(value, tuple):
        return '<{} arrays>'.format(len(value))
    return _short(value)


def _fmt_param(entry):
    """Describe one entry of a ``params`` signature: (name, shape, dtype) or (shape, dtype)."""
    if len(entry) == 3:
        return "'{}' with shape {} dtype {}".format(entry[0], entry[1], entry[2])
    return 'shape {} dtype {}'.format(entry[0], entry[1])


def _first_difference(everyone):
    """Return a line naming the first sig entry on which two ranks differ, or ''."""
    bad = [(r, dict(e[1])[INVALID_INPUT]) for r, e in enumerate(everyone)
           if INVALID_INPUT in dict(e[1])]
    if bad:
        return 'Invalid input on {}.\n'.format('; '.join('rank {}: {}'.format(r, m) for r, m in bad))
    ref_rank, (ref_name, ref_sig) = 0, everyone[0][:2]
    for r, entry in enumerate(everyone):
        name, sig = entry[:2]
        if name != ref_name:
            continue
        a, b = dict(ref_sig), dict(sig)
        for key in list(a) + [k for k in b if k not in a]:
            va, vb = a.get(key), b.get(key)
            if va == vb:
                continue
            if isinstance(va, tuple) and isinstance(vb, tuple) and key == 'params':
                return _params_difference(va, vb, ref_rank, r)
            return 'First difference: {} is {} on rank {} but {} on rank {}.\n'.format(
                key, _short(va), ref_rank, _short(vb), r)
    return ''


def _params_difference(va, vb, ra, rb):
    for i, (x, y) in enumerate(zip(va, vb)):
        if x != y:
            return 'First difference: parameter {} is {} on rank {} but {} on rank {}.\n'.format(
                i, _fmt_param(x), ra, _fmt_param(y), rb)
    longer, rl, n = (va, ra, len(vb)) if len(va) > len(vb) else (vb, rb, len(va))
    return ('First difference: params has {} arrays on rank {} but {} on rank {}; rank {} also has '
            'parameter {} (does a parameter have no gradient on one rank? use zero_fill=True).\n'.format(
                len(va), ra, len(vb), rb, rl, _fmt_param(longer[n])))
