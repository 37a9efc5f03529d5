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

import os
import time

from chainermn_comm import trace
from chainermn_comm.guard import departure
from chainermn_comm.guard import exit_check
from chainermn_comm.guard import report
from chainermn_comm.guard import watchdog
from chainermn_comm.guard.agreement import Agreement
from chainermn_comm.guard.config import GuardConfig

__all__ = ['CallGuard', 'invalid_input_sig']


def invalid_input_sig(problem):
    """Return the signature of a call whose arguments are invalid on this rank."""
    return ((report.INVALID_INPUT, '{}: {}'.format(type(problem).__name__, problem)),)


class CallGuard:
    """Check that ranks agree on each collective call, report stalls and abort calls that hang.

    State: :attr:`config` (timeout, stall threshold, mode), :attr:`agreement` (the check),
    :attr:`watch` (the stall inspector), and the calls: :attr:`seq`, :attr:`collective_seq`,
    :attr:`current` and :attr:`last` (``(name, seq, sig, start, info, collective number or 0)``).
    """

    def __init__(self, mpi_comm, timeout=None, debug=None, check=None, hosts=None):
        from mpi4py import MPI
        self.rank = mpi_comm.Get_rank()
        self.size = mpi_comm.Get_size()
        self.host = MPI.Get_processor_name()
        self.config = GuardConfig.resolve(self.size, timeout, debug, check)
        #: Every rank's host when the communicator knows them (else None).
        self.hosts = list(hosts) if hosts is not None else None
        self.agreement = Agreement(mpi_comm, self.rank, self.size, self.host, self.config.check,
                                   self.config.debug, hosts)
        self.watch = watchdog.Watch(mpi_comm, self.config, self.size)
        #: Every rank's payload after a checked call given ``payload=`` (see :meth:`take_payload`).
        self.payload = None
        #: Number of guarded calls entered so far (point-to-point and collective).
        self.seq = 0
        #: Number of collective calls entered so far.
        self.collective_seq = 0
        self.current = None
        self.last = None
        #: The number of the last collective call that raised on this rank (0: none did).
        self.failed_collective = 0
        #: The next call, as described by ``__call__``: (name, sig, key, info, collective, payload,
        #: problem, traced).
        self._next = None
        #: When this rank left its last collective (time.monotonic; None before the first).
        self._left = None
        #: While tracing: (start on the trace clock, traced) of the current call.
        self._trace = None
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
        """Describe the next call; ``payload``: a C-contiguous host array of at most
        ``PAYLOAD_BYTES`` to all-gather with the check (same size on every rank that agrees);
        ``problem``: this rank's invalid argument, raised once every rank is in the check;
        ``traced``: the trace event's arguments (see the module docstring)."""
        if problem is not None:
            sig, key = invalid_input_sig(problem), None
        self._next = (name, sig, key, info, collective, payload, problem, traced)
        return self

    def take_payload(self):
        """Return every rank's payload gathered by the check (one array per rank, shaped and typed
        like the payload, in rank order; valid until the next call), or None."""
        rows, self.payload = self.payload, None
        return rows

    def __enter__(self):
        name, sig, key, info, collective, payload, problem, traced = self._next
        self.seq += 1
        number = 0
        if collective:
            self.collective_seq += 1
            number = self.collective_seq
        arrived = time.monotonic()
        cur = self.current = (name, self.seq, sig, arrived, info, number)
        self.payload = None
        tracing = trace.ON
        self._trace = (trace.now(), traced) if tracing else None
        agreement = self.agreement
        if number and (agreement.check or agreement.debug_comm is not None):
            since = -1
            if agreement.arrivals and self._left is not None:
                since = int((arrived - self._left) * 1e6)
            try:
                self.payload = agreement.run(cur, key, payload, number, since)
            except BaseException:
                self.current = None
                self._trace = None
                raise
            if tracing:
                trace.record('wait', 'wait', self._trace[0], trace.now(),
                             {'call': number, 'collective': name})
        if problem is not None:
            self.__exit__(None, None, None)
            raise problem
        return self

    def __exit__(self, *exc):
        cur = self.last = self.current
        self.current = None
        self.payload = None
        if exc[0] is not None and cur is not None and cur[5]:
            self.failed_collective = cur[5]
        if cur is not None and cur[5] and self.agreement.arrivals:
            self._left = time.monotonic()
        if self._trace is not None:
            start, traced = self._trace
            self._trace = None
            if cur is not None:
                trace.record(cur[0], 'comm', start, trace.now(), comm_args(cur, traced))
        return False

    def device_timed(self):
        """Return a context whose device work (current CUDA stream) is this call's ``comm`` event.

        For GPU communicators, whose collectives return before the GPU has done them: inside
        the guard, the work queued within this context is timed with CUDA events instead of
        the host time of the whole call.  Does nothing unless tracing.
        """
        if self._trace is None:
            return _NO_DEVICE
        return _DeviceTimed(self)

    # -- reports ----------------------------------------------------------------------------------
    def describe(self, cur):
        """Return a one-line description of the call ``cur``: name, sequence number, sig and info."""
        return report.describe(cur)

    def progress(self):
        """Return what this rank is doing, for another rank's stall report (watchdog thread)."""
        cur = self.current
        return {'host': self.host, 'pid': os.getpid(), 'collectives': self.collective_seq,
                'call': None if cur is None else report.describe(cur),
                'number': 0 if cur is None else cur[5]}

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
        args['call'] = cur[5]
        return args
    args = {'bytes': 0, 'dtype': 'object' if cur[0].endswith('_obj') else '', 'op': '',
            'call': cur[5]}
    sig = cur[2]
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

    def __init__(self, guard):
        self.guard = guard
        self.token = None

    def __enter__(self):
        self.token = trace.begin(device=True)
        return self

    def __exit__(self, *exc):
        guard = self.guard
        if guard._trace is None or guard.current is None:
            return False
        traced = guard._trace[1]
        guard._trace = None
        trace.end(self.token, guard.current[0], 'comm', comm_args(guard.current, traced))
        return False
