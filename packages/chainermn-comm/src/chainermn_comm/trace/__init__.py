"""Record where each rank's time goes, as a timeline Perfetto and chrome://tracing open.

Set ``CHAINERMN_TRACE=DIR`` on every rank; recording starts when the first communicator is
created (``create_communicator`` or a communicator's constructor).  Each rank keeps its newest
``CHAINERMN_TRACE_EVENTS`` events (default 200000) in memory and writes them at exit into
``DIR/trace.rank<R>.json``; the last rank to finish merges the parts into ``DIR/trace.json``.
The file format, the categories and the clock are described in ``docs/trace.md``.

Unset, nothing is recorded and each instrumented place costs one check of :data:`ON`.

>>> from chainermn_comm import trace
>>> if trace.ON:                      # on hot paths; trace.enabled() elsewhere
...     t0 = trace.now()
...     trace.record('load', 'data', t0, trace.now())
>>> with trace.span('checkpoint save', 'io'):
...     pass
"""

import atexit
import signal
import threading
import time

from chainermn_comm import settings
from chainermn_comm.protocol import TRACE_ENV, TRACE_EVENTS_ENV
from chainermn_comm.trace._export import merge as _merge

__all__ = ['ON', 'enabled', 'now', 'record', 'span', 'instant', 'set_thread_name', 'flush',
           'merge', 'begin', 'end', 'directory', 'communicator_created']

#: True while this process records (read it on hot paths: one attribute check).
ON = False
#: The recording clock: ``time.perf_counter_ns`` (converted to rank 0's wall clock when written).
now = time.perf_counter_ns

_current = None
_start_lock = threading.Lock()


def enabled():
    """Return True when this process records trace events."""
    return ON


def directory():
    """Return the directory the trace is written to, or None when not tracing."""
    return None if _current is None else _current.directory


def record(name, cat, start_ns, end_ns, args=None):
    """Record one complete event of the calling thread from ``start_ns`` to ``end_ns`` (:func:`now`)."""
    t = _current
    if ON and t is not None:
        t.ring.add(('X', name, cat, start_ns, end_ns, t.ring.tid(), args))


def instant(name, cat, args=None):
    """Record an instant event ("ph": "i") on the calling thread."""
    t = _current
    if ON and t is not None:
        stamp = now()
        t.ring.add(('i', name, cat, stamp, stamp, t.ring.tid(), args))


class _Span:
    __slots__ = ('name', 'cat', 'args', 't0')

    def __init__(self, name, cat, args):
        self.name, self.cat, self.args = name, cat, args

    def __enter__(self):
        self.t0 = now()
        return self

    def __exit__(self, *exc):
        record(self.name, self.cat, self.t0, now(), self.args)
        return False


class _NoSpan:
    __slots__ = ()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


_NO_SPAN = _NoSpan()


def span(name, cat, **args):
    """Return a context that records the block it wraps as one event (does nothing when off)."""
    return _Span(name, cat, args or None) if ON else _NO_SPAN


def set_thread_name(name):
    """Name the calling thread's track (the main thread is "main"; the overlap thread "overlap")."""
    if ON and _current is not None:
        _current.ring.name_thread(name)


def begin(device=False):
    """Start timing an event: return a token for :func:`end` (None when off).

    ``device=True`` times the work queued on the current CUDA stream instead of the host:
    a CUDA event is recorded now and at :func:`end`, and the pair is resolved later, when
    the GPU has reached it, without waiting for it.
    """
    if not ON:
        return None
    if device:
        return ('device', _current.device.begin())
    return now()


def end(token, name, cat, args=None, track=None):
    """Record the event started by :func:`begin`; device events get ``"device": true``.

    ``track`` puts the event on a named track of its own instead of the calling thread's
    (e.g. buckets averaged on a side CUDA stream).
    """
    t = _current
    if token is None or t is None or not ON:
        return
    tid = t.ring.tid() if track is None else t.ring.track(track)
    if isinstance(token, tuple):
        args = dict(args or {}, device=True)
        t.device.end(token[1], name, cat, args, tid)
    else:
        t.ring.add(('X', name, cat, token, now(), tid, args))


def flush(reason='exit'):
    """Write this rank's part file and merge the parts (idempotent); return trace.json's path or None."""
    t = _current
    if t is None:
        return None
    return t.flush(reason)


def merge(directory):
    """Merge the part files in ``directory`` (the newest run's) into ``directory/trace.json``.

    Returns the path written, or None when there is no part.  ``python -m chainermn trace DIR``
    calls it when ``trace.json`` is missing or older than a part.
    """
    return _merge(directory)


def communicator_created(mpi_comm):
    """Start recording if ``CHAINERMN_TRACE`` is set (called by every communicator's constructor).

    The clock offset against rank 0 is estimated at the first communicator that spans
    ``MPI.COMM_WORLD`` (collective there); a job whose communicators all span less keeps offset 0.
    """
    global ON, _current
    if _current is not None and _current.run is not None:
        return
    where = settings.read(TRACE_ENV)
    if not where:
        return
    from mpi4py import MPI
    world = MPI.COMM_WORLD
    if _current is None:
        _refuse_bad_directory(mpi_comm, where)
    with _start_lock:
        if _current is None:
            from chainermn_comm.trace._tracer import Tracer
            _current = Tracer(where, settings.read(TRACE_EVENTS_ENV), world.Get_rank(),
                             world.Get_size(), MPI.Get_processor_name())
            _install_exit_handlers()
            ON = True
    if _current.run is None and MPI.Comm.Compare(mpi_comm, world) in (MPI.IDENT, MPI.CONGRUENT):
        _current.start_clock(world)


def _refuse_bad_directory(mpi_comm, where):
    """Raise ValueError on every rank of ``mpi_comm`` when a rank cannot use the trace directory."""
    from chainermn_comm.trace._export import directory_problem
    problems = mpi_comm.allgather(directory_problem(TRACE_ENV, where))
    bad = [(r, p) for r, p in enumerate(problems) if p is not None]
    if bad:
        others = ''
        if len(bad) > 1:
            others = ' (rank(s) {} likewise)'.format(','.join(str(r) for r, _ in bad[1:]))
        raise ValueError('rank {}: {}{}'.format(bad[0][0], bad[0][1], others))


# -- exit paths -------------------------------------------------------------------------------
def _at_exit():
    try:
        flush('exit')
    except Exception as e:   # the job's result stands; say why its trace is missing
        from chainermn_comm.log import get_logger
        get_logger('trace').warning('the trace could not be written to %s: %s: %s',
                                    directory(), type(e).__name__, e)


def _on_sigterm(signum, frame):
    """Write the trace, then die of SIGTERM as the default action would."""
    try:
        flush('sigterm')
    finally:
        signal.signal(signum, signal.SIG_DFL)
        signal.raise_signal(signum)


def _install_exit_handlers():
    atexit.register(_at_exit)
    # Only where nobody handles SIGTERM yet (the preemption handler installs its own later and
    # flushes itself when it stops the job) and only from the main thread (Python's rule).
    if threading.current_thread() is threading.main_thread():
        try:
            if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
                signal.signal(signal.SIGTERM, _on_sigterm)
        except (ValueError, OSError):
            pass
