"""CallGuard: the per-communicator bookkeeping around every blocking call.

Every blocking call of a communicator runs inside ``with guard(name, sig, collective=..., key=...,
problem=..., **info):``.  ``sig`` is a tuple of ``(key, value)`` pairs all ranks must agree on
(shape, dtype, root, parameter list), or a callable returning one (for signatures that cost time
to build, built only when needed); ``key`` is an optional cheap stand-in for ``sig`` made of ints
and tuples only (hashed the same way in every process); ``problem`` is this rank's invalid
argument (an exception), raised after the check so that every rank fails together; ``info`` is
only shown in reports (e.g. the peer of a send).

While tracing (:mod:`chainermn_comm.trace`) each call is a ``comm`` event from entering the guard
to leaving it, and the agreement check inside it a ``wait`` event; ``traced`` (a dict, built by
the caller only when ``trace.ON``) gives the event's ``bytes``/``dtype``/``op``/``grad``
arguments, which otherwise come from the signature's shape, dtype and op when it has them.
"""

import dataclasses
import os
import time

from chainermn_comm import trace, voice
from chainermn_comm.guard import departure
from chainermn_comm.guard import exit_check
from chainermn_comm.guard import report
from chainermn_comm.guard import watchdog
from chainermn_comm.guard.agreement import Agreement
from chainermn_comm.guard.config import GuardConfig

__all__ = ['CallGuard', 'Call', 'invalid_input_sig']


def invalid_input_sig(problem):
    """Return the signature of a call whose arguments are invalid on this rank."""
    return ((report.INVALID_INPUT, '{}: {}'.format(type(problem).__name__, problem)),)


@dataclasses.dataclass(eq=False)
class Call:
    """One checked call: the record that reports read, and the ``with`` context that checks it.

    ``guard(name, sig, ...)`` makes one per call (so calls may nest); entering it numbers it
    (:attr:`seq`, :attr:`number`: its collective number, 0 for point-to-point), stamps
    :attr:`start` (``time.monotonic``), makes it the guard's :attr:`CallGuard.current` and runs
    the agreement check; leaving it makes it :attr:`CallGuard.last`.
    """

    __slots__ = ('guard', 'name', 'sig', 'key', 'info', 'collective', 'payload', 'problem',
                 'traced', 'seq', 'start', 'number', 'rows', 'trace_start', 'outer')
    guard: object       # the CallGuard (None once the call has ended)
    name: str
    sig: object         # ((key, value), ...) all ranks must agree on, or a callable returning it
    key: object         # a cheap stand-in for ``sig`` (ints and tuples), or None
    info: dict          # shown in reports only (e.g. the peer of a send)
    collective: bool
    payload: object     # a small host array all-gathered with the check, or None
    problem: object     # this rank's invalid argument (raised after the check), or None
    traced: object      # the trace event's arguments, or None
    seq: int            # the guard's number of this call (every call)
    start: float        # when it was entered (time.monotonic)
    number: int         # its collective number, 0 for a point-to-point call
    rows: object        # every rank's payload after the check, or None
    trace_start: object  # while tracing: when it was entered on the trace clock
    outer: object       # the call this one runs inside of, or None

    @classmethod
    def record(cls, name, seq, sig=(), info=None, number=0, start=0.0):
        """Return the record of a call that no guard runs (for reports and tests)."""
        return cls(None, name, sig, None, info or {}, bool(number), None, None, None, seq, start,
                   number, None, None, None)

    def take_payload(self):
        """Return every rank's payload gathered by the check (one array per rank, shaped and typed
        like the payload, in rank order; valid until the next call), or None."""
        rows, self.rows = self.rows, None
        return rows

    def __enter__(self):
        guard = self.guard
        guard.seq += 1
        self.seq = guard.seq
        if self.collective:
            guard.collective_seq += 1
            self.number = guard.collective_seq
        self.start = arrived = time.monotonic()
        self.outer = guard.current
        guard.current = self
        if trace.ON:
            self.trace_start = trace.now()
        agreement = guard.agreement
        if self.number and (agreement.check or agreement.debug_comm is not None):
            since = -1
            if agreement.arrivals and guard._left is not None:
                since = int((arrived - guard._left) * 1e6)
            try:
                self.rows = agreement.run(self, self.key, self.payload, self.number, since)
            except BaseException:
                guard.current = self.outer
                self.trace_start = None
                raise
            if self.trace_start is not None:
                trace.record('wait', 'wait', self.trace_start, trace.now(),
                             {'call': self.number, 'collective': self.name})
        if self.problem is not None:
            self.__exit__(None, None, None)
            raise self.problem
        return self

    def __exit__(self, exc_type, exc, tb):
        guard = self.guard
        if guard is None:
            return False
        guard.last = self
        guard.current = self.outer
        self.outer = self.guard = self.rows = None  # a record now: it holds no guard alive
        number = self.number
        if number:
            if exc_type is not None:
                guard.failed_collective = number
            if guard.agreement.arrivals:
                guard._left = time.monotonic()
        if self.trace_start is not None:
            start, self.trace_start = self.trace_start, None
            trace.record(self.name, 'comm', start, trace.now(), comm_args(self, self.traced))
        return False


class CallGuard:
    """Check that ranks agree on each collective call, report stalls and abort calls that hang.

    State: :attr:`config` (timeout, stall threshold, mode), :attr:`agreement` (the check),
    :attr:`watch` (the stall inspector), and the calls: :attr:`seq`, :attr:`collective_seq`,
    :attr:`current` (the innermost :class:`Call` running, or None) and :attr:`last` (the last
    one that ended).
    """

    def __init__(self, mpi_comm, timeout=None, debug=None, check=None, hosts=None):
        from mpi4py import MPI
        self.rank = mpi_comm.Get_rank()
        self.size = mpi_comm.Get_size()
        self.host = MPI.Get_processor_name()
        self.config = GuardConfig.resolve(self.size, timeout, debug, check)
        #: Every rank's host when the communicator knows them (else None).
        self.hosts = list(hosts) if hosts is not None else None
        #: The world rank of each rank, or None on a communicator numbered as the whole job
        #: (reports name ranks by their world rank, :func:`chainermn_comm.guard.report.who`).
        self.world_of = voice.world_ranks(mpi_comm)
        self.agreement = Agreement(mpi_comm, self.rank, self.size, self.host, self.config.check,
                                   self.config.debug, hosts, self.world_of)
        self.watch = watchdog.Watch(mpi_comm, self.config, self.size)
        #: Number of guarded calls entered so far (point-to-point and collective).
        self.seq = 0
        #: Number of collective calls entered so far.
        self.collective_seq = 0
        self.current = None
        self.last = None
        #: The number of the last collective call that raised on this rank (0: none did).
        self.failed_collective = 0
        #: When this rank left its last collective (time.monotonic; None before the first).
        self._left = None
        if self.watch.side is not None and self.config.exit_notice:
            # Before the debug mode's check at exit registers: the notices go after that check.
            departure.arm(self)
        if self.config.debug and MPI.Comm.Compare(mpi_comm, MPI.COMM_WORLD) in (MPI.IDENT, MPI.CONGRUENT):
            exit_check.register(self)
        if self.config.timeout > 0 or self.watch.side is not None:
            watchdog.watch(self)

    # The configuration, as attributes (tests and fail_together read them; ``check`` may be turned off).
    @property
    def timeout(self):
        return self.config.timeout

    @property
    def stall_seconds(self):
        return self.config.stall_seconds

    @property
    def debug(self):
        return self.config.debug

    @property
    def check(self):
        return self.agreement.check

    @check.setter
    def check(self, value):
        self.agreement.check = bool(value)

    def close(self):
        """Stop the stall inspector's side channel of this guard (call before freeing the communicator)."""
        self.watch.close()

    def leave(self, why):
        """Tell the other ranks that this rank leaves the communicator (e.g. 'called finalize()')."""
        departure.leave(self, why)

    def mark(self, word):
        """Let ``word`` (an int) ride on the next collective's agreement check; False when it cannot."""
        return self.agreement.mark(word)

    @property
    def marks(self):
        """Every rank's word from the last collective that carried marks (rank order), or None."""
        return self.agreement.marks

    def hosts_of(self, rank):
        """Return the host of ``rank`` when this guard knows it, else '?'."""
        if self.hosts is not None and 0 <= rank < len(self.hosts):
            return self.hosts[rank]
        return '?'

    def __call__(self, name, sig=(), collective=True, key=None, payload=None, problem=None,
                 traced=None, **info):
        """Return the context of the next call (a :class:`Call`); ``payload``: a C-contiguous host
        array of at most ``PAYLOAD_BYTES`` to all-gather with the check (same size on every rank
        that agrees; read it with :meth:`Call.take_payload`); ``problem``: this rank's invalid
        argument, raised once every rank is in the check; ``traced``: the trace event's arguments
        (see the module docstring)."""
        if problem is not None:
            sig, key = invalid_input_sig(problem), None
        return Call(self, name, sig, key, info, collective, payload, problem, traced, 0, 0.0, 0,
                    None, None, None)

    def device_timed(self):
        """Return a context whose device work (current CUDA stream) is this call's ``comm`` event.

        For GPU communicators, whose collectives return before the GPU has done them: inside
        the guard, the work queued within this context is timed with CUDA events instead of
        the host time of the whole call.  Does nothing unless tracing.
        """
        cur = self.current
        if cur is None or cur.trace_start is None:
            return _NO_DEVICE
        return _DeviceTimed(cur)

    # -- reports ----------------------------------------------------------------------------------
    def describe(self, cur):
        """Return a one-line description of the call ``cur``: name, sequence number, sig and info."""
        return report.describe(cur)

    def progress(self):
        """Return what this rank is doing, for another rank's stall report (watchdog thread)."""
        cur = self.current
        return {'host': self.host, 'pid': os.getpid(), 'collectives': self.collective_seq,
                'call': None if cur is None else report.describe(cur),
                'number': 0 if cur is None else cur.number}

    def tick(self, now, thread):
        """Do this guard's watchdog work; return the seconds until it needs the thread again."""
        return self.watch.tick(self, now, thread)

    def fire(self, cur, elapsed):
        """Report the stuck call with every thread's stack and abort the whole job."""
        watchdog.fire(self, cur, elapsed)


def comm_args(cur, traced):
    """Return the ``comm`` event's arguments of call ``cur``: bytes, dtype, op, call number, ..."""
    if traced:
        args = dict(traced)
        args.setdefault('bytes', 0)
        args.setdefault('dtype', '')
        args.setdefault('op', '')
        args['call'] = cur.number
        return args
    args = {'bytes': 0, 'dtype': 'object' if cur.name.endswith('_obj') else '', 'op': '',
            'call': cur.number}
    sig = cur.sig
    if type(sig) is tuple:  # a callable signature costs time to build: not for a trace event
        shape = dtype = None
        for pair in sig:
            what = pair[0]
            if what == 'shape':
                shape = pair[1]
            elif what == 'dtype':
                dtype = pair[1]
            elif what == 'op':
                args['op'] = str(pair[1])
        if dtype is not None:
            itemsize, name = _dtype_info(dtype)
            for n in shape or ():
                itemsize *= n
            args['bytes'] = int(itemsize)
            args['dtype'] = name
    return args


_dtype_infos = {}


def _dtype_info(dtype):
    """Return (itemsize, name) of a dtype given as its ``str`` (cached: NumPy's parse is slow)."""
    info = _dtype_infos.get(dtype)
    if info is None:
        import numpy
        d = numpy.dtype(dtype)
        info = _dtype_infos[dtype] = (d.itemsize, d.name)
    return info


class _NoDevice:
    __slots__ = ()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


_NO_DEVICE = _NoDevice()


class _DeviceTimed:
    """Time the device work of a guarded call; the guard then records no host-timed event."""

    def __init__(self, call):
        self.call = call
        self.token = None

    def __enter__(self):
        self.token = trace.begin(device=True)
        return self

    def __exit__(self, *exc):
        call = self.call
        if call.trace_start is None or call.guard is None:
            return False
        call.trace_start = None
        trace.end(self.token, call.name, 'comm', comm_args(call, call.traced))
        return False
