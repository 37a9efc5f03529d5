"""Tune the gradient average on the job's own gradients: the wire format and the knobs.

A :class:`Tuner` runs a fixed schedule over the first calls of a gradient average.  Call 1 is a
warm-up (buffers, shared memory, page faults) with the defaults.  Then, one *axis* at a time
(the wire format when ``allreduce_grad_dtype='auto'``, shared memory on or off, the shared-memory
chunk, the MPI chunk; the overlap path adds its mode and bucket size), every value of the axis
is timed in up to ``SAMPLES`` rounds of one call each (rounds alternate direction), the other
axes held at their current choice.  After each round one ``Allreduce(MAX)`` of the local times
gives every rank the slowest rank's times; a value more than ``DROP_FIRST`` times slower than the
fastest after the first round, or ``DROP`` times after a later one, is not timed again (a
float16 wire on a fast link costs one update, not three).  The first round only drops clear
losers because a value's first call also pays for its own buffers (a new wire's first call was
measured at up to 1.75x its steady time on the namespace cluster); ml_dtypes, which the bfloat16
wire casts with where installed, is imported before the schedule starts.  Each value scores the
best of its samples, and a challenger replaces the current value only when it is more than
``MARGIN`` faster.  Every rank follows the same schedule and computes the same choice from the same numbers, so the ranks never disagree on a configuration, and
the collectives of each call match.  Every configuration averages correctly, so the calls that
tune are real updates.

The schedule runs again at call ``RECHECK_FIRST`` and then every ``RECHECK_EVERY`` calls, so a
link that became faster or slower (another job sharing it) is followed.  Each set of gradients
(their count and size) that the plain path averages has its own schedule (another model tunes
anew, with a warm-up, from the choice so far).  The first decision is
logged on rank 0 (``chainermn.tune``), later ones only when the choice changed; with tracing on
(``chainermn_comm.trace``) each decision is also a trace event.

What may be tuned never changes results beyond what the user allowed:

- the wire format only with ``allreduce_grad_dtype='auto'``, which permits float16 and bfloat16
  (``None`` stays the gradients' own dtype, exact); not on one node that averages through
  shared memory, where nothing crosses a wire;
- chunk sizes never change the order of any sum, except MPI's own order on more than two ranks
  when chunks of float32 change MPI's algorithm: the MPI chunk is tuned only with two ranks or a
  16-bit wire (whose sums are ours);
- shared memory against MPI messages only where both give the same bits: two ranks and an
  exact wire (a + b == b + a).

``CHAINERMN_TUNE=0`` keeps every knob at its default (the wire is still tuned for ``'auto'``);
each knob's own variable (``CHAINERMN_CHUNK_BYTES``, ``CHAINERMN_SHM_CHUNK_BYTES``,
``CHAINERMN_SHM_REDUCE``, ``CHAINERMN_OVERLAP_BUCKET_BYTES``, ``CHAINERMN_OVERLAP_MODE``) pins it.
"""

import time
import zlib

import numpy

from chainermn_comm.reduce import codecs as _codecs
from chainermn_comm.reduce import chunked as _grad
from chainermn_comm.reduce import node_shared as _shm_reduce
from chainermn_comm import settings
from chainermn_comm._errors import CommunicationError
from chainermn_comm.protocol import SHM_REDUCE_ENV, TUNE_ENV

__all__ = ['Tuner', 'CallTuning', 'TunedMean', 'wire_axes', 'reducer_axes', 'apply_reducer_config',
           'knobs_tunable', 'is_auto', 'AUTO', 'WIRE_CHOICES', 'label', 'SAMPLES', 'DROP', 'DROP_FIRST',
           'MARGIN', 'RECHECK_FIRST', 'RECHECK_EVERY']

AUTO = 'auto'
#: The wire formats ``'auto'`` chooses from: the gradients' own dtype (exact), float16, bfloat16.
WIRE_CHOICES = (None, numpy.dtype(numpy.float16), _codecs.BFLOAT16_NAME)
#: Calls timed per value of an axis, at most (one per round).
SAMPLES = 3
#: A value this many times slower than the fastest after the first round is not timed again.
DROP_FIRST = 2.0
#: The same after any later round.
DROP = 1.25
#: A challenger must be this much faster than the current value to replace it.
MARGIN = 0.03
#: The call at which the schedule first runs again, and the period after that.
RECHECK_FIRST = 1000
RECHECK_EVERY = 10000
#: Sets of gradients whose schedules the plain path keeps (the oldest is forgotten).
_SETS = 4


def label(value):
    """Return how a configuration value is written in logs and traces."""
    if value is None:
        return 'float32'
    if isinstance(value, bool):
        return 'on' if value else 'off'
    if isinstance(value, int) and value >= 1024:
        return '{:g}KiB'.format(value / 1024) if value < 1 << 20 else '{:g}MiB'.format(value / (1 << 20))
    if isinstance(value, str):
        return value
    try:
        return numpy.dtype(value).name
    except TypeError:
        return str(value)


def _trace(args):
    """Put a tuning decision into the trace when tracing is available (it may not be installed)."""
    try:
        from chainermn_comm import trace
    except ImportError:
        return
    trace.instant('tune', 'tune', args)


def is_auto(grad_dtype):
    """Return whether ``grad_dtype`` (an ``allreduce_grad_dtype``) asks the tuner to choose the wire."""
    return isinstance(grad_dtype, str) and grad_dtype == AUTO


def knobs_tunable():
    """Return whether knobs that are not pinned are tuned (``CHAINERMN_TUNE``, default on)."""
    return bool(settings.read(TUNE_ENV))


class Tuner:
    """Choose, identically on every rank of ``mpi_comm``, the fastest value of each axis.

    ``axes`` is a list of ``(name, values_fn)``: ``values_fn(choice)`` returns the values to
    try given the current choice (a dict), the current value first; an axis with fewer than
    two values is skipped.  ``initial`` is the starting choice.  Use :meth:`config` before and
    :meth:`record` after each call.
    """

    def __init__(self, mpi_comm, what, axes, initial):
        self.mpi_comm = mpi_comm
        self.what = what
        self.axes = list(axes)
        self.choice = dict(initial)
        #: Calls recorded so far.
        self.calls = 0
        #: Every finished schedule: (call, {axis: {label: seconds}}, choice).
        self.history = []
        self._next_run = 1  # the call after which a schedule starts
        self._axis = -1     # index into ``axes`` of the axis being timed, -1: none
        self._values = ()
        self._queue = []
        self._times = None
        self._round = 0
        self._trying = None
        self._figures = {}
        self._t0 = None

    @property
    def tuning(self):
        """Whether a schedule is running (calls may try other values)."""
        return self._axis >= 0

    def config(self):
        """Return the configuration (a dict) of the next call and start its clock."""
        cfg = self.choice
        if self._queue:
            self._trying = self._queue[0]
            cfg = dict(cfg)
            cfg[self.axes[self._axis][0]] = self._values[self._trying]
        self._t0 = time.perf_counter()
        return cfg

    def record(self, seconds=None):
        """Record the call started by :meth:`config` (``seconds``: its time, else the clock's)."""
        if seconds is None:
            seconds = time.perf_counter() - self._t0
        self.calls += 1
        if self._queue:
            i = self._queue.pop(0)
            self._times[i].append(seconds)
            if not self._queue:
                self._round_done()
        elif self._axis < 0 and self.calls == self._next_run:
            self._figures = {}
            self._axis = -1
            self._next_axis()

    # -- the schedule ---------------------------------------------------------------------------
    def _next_axis(self):
        while True:
            self._axis += 1
            if self._axis >= len(self.axes):
                self._finish()
                return
            name, values_fn = self.axes[self._axis]
            values = tuple(values_fn(self.choice))
            self._agree(name, values)
            if len(values) < 2:
                continue
            self._values = values
            self._times = [[] for _ in values]
            self._round = 0
            self._queue = list(range(len(values)))
            return

    def _agree(self, name, values):
        """Raise on every rank unless every rank tries the same values of axis ``name``."""
        from mpi4py import MPI
        code = zlib.crc32(repr((name, [label(v) for v in values])).encode())
        h = numpy.array([code, -code], dtype=numpy.int64)
        self.mpi_comm.Allreduce(MPI.IN_PLACE, h, MPI.MAX)
        if h[0] != -h[1]:
            raise CommunicationError(
                'rank {}: the ranks would tune {} of {} over different values (here {}); the '
                'CHAINERMN_* variables that pin it (see chainermn_comm.reduce.tune) must be the same on '
                'every rank'.format(self.mpi_comm.Get_rank(), name, self.what,
                                    ', '.join(label(v) for v in values)))

    def _round_done(self):
        """Agree on the times so far; queue the next round of the values still in the race, or decide."""
        from mpi4py import MPI
        t = numpy.full((len(self._values), SAMPLES), numpy.inf)
        for i, times in enumerate(self._times):
            t[i, :len(times)] = times
        self.mpi_comm.Allreduce(MPI.IN_PLACE, t, MPI.MAX)  # the slowest rank's time of each call
        best = t.min(axis=1)
        self._round += 1
        if self._round < SAMPLES:
            drop = DROP_FIRST if self._round == 1 else DROP
            race = [i for i in range(len(best)) if best[i] <= drop * best.min()]
            if len(race) > 1:
                # Rounds alternate direction, so no value always follows the same other value.
                self._queue = race if self._round % 2 == 0 else race[::-1]
                return
        self._decide(best)
        self._next_axis()

    def _decide(self, best):
        name = self.axes[self._axis][0]
        current = 0
        pick = int(numpy.argmin(best))
        if best[pick] > best[current] * (1.0 - MARGIN):
            pick = current
        self._figures[name] = {label(v): float(s) for v, s in zip(self._values, best)}
        self.choice = dict(self.choice)
        self.choice[name] = self._values[pick]
        self._queue = []
        self._trying = None

    def _finish(self):
        self._axis = -1
        self._next_run = RECHECK_FIRST if self.calls < RECHECK_FIRST else self.calls + RECHECK_EVERY
        previous = self.history[-1][2] if self.history else None
        self.history.append((self.calls, self._figures, dict(self.choice)))
        if not self._figures:
            return
        changed = previous is not None and previous != self.choice
        figures = {axis: {k: round(v * 1e3, 3) for k, v in f.items()} for axis, f in self._figures.items()}
        if self.mpi_comm.Get_rank() == 0 and (previous is None or changed):
            from chainermn_comm.log import get_logger
            get_logger('tune').info(
                '%s tuned at call %d: %s; ms per value (slowest rank, best of up to %d calls): %s; '
                'next check at call %d', self.what, self.calls,
                ', '.join('{}={}'.format(k, label(v)) for k, v in sorted(self.choice.items())),
                SAMPLES, figures, self._next_run)
        _trace({'what': self.what, 'call': self.calls, 'changed': changed,
                'choice': {k: label(v) for k, v in self.choice.items()}, 'ms': figures})


# -- the host reducer's axes ------------------------------------------------------------------
def _first(current, values):
    """Return ``values`` with ``current`` first (added when missing)."""
    return (current,) + tuple(v for v in values if label(v) != label(current))


def reducer_axes(reducer, grad_dtype, knobs=True):
    """Return the axes of a :class:`NodeReducer`'s average: wire format, shared memory, chunks.

    ``grad_dtype`` is the communicator's ``allreduce_grad_dtype`` (``'auto'`` tunes the wire);
    ``knobs=False`` leaves the knobs alone.  Decide after the reducer's first ``mean`` (that is
    when it knows whether shared memory is usable).
    """
    size = reducer.mpi_comm.Get_size()
    axes = []
    if is_auto(grad_dtype):
        _codecs.load_ml_dtypes()  # not inside the first timed bfloat16 call
        def dtype(c):
            if reducer.shared_usable and reducer.topology.inter_size == 1:
                return ()  # one node averages in shared memory: no wire, nothing to choose
            return _first(c.get('dtype'), WIRE_CHOICES)
        axes.append(('dtype', dtype))
    if not knobs:
        return axes

    def shared(c):
        exact = _codecs.codec_of(c.get('dtype')) is None
        if not reducer.shared_usable or settings.is_set(SHM_REDUCE_ENV) or size != 2 \
                or not exact:
            return ()
        return _first(reducer.use_shared, (True, False))

    def shm_chunk(c):
        if not (reducer.shared_usable and c.get('shared', reducer.use_shared)) or reducer.chunk_pinned:
            return ()
        return _first(reducer.chunk_bytes, _shm_reduce.SHM_CHUNK_CHOICES)

    def chunk(c):
        chunked = reducer.chunked
        lossy = _codecs.codec_of(c.get('dtype')) is not None
        uses_mpi = not (reducer.shared_usable and c.get('shared', reducer.use_shared))
        if not uses_mpi or chunked.chunk_pinned or not (size == 2 or lossy):
            return ()
        return _first(chunked.chunk_bytes, _grad.LOSSY_CHUNK_CHOICES if lossy else _grad.CHUNK_CHOICES)
    axes += [('shared', shared), ('shm_chunk', shm_chunk), ('chunk', chunk)]
    return axes


def apply_reducer_config(reducer, cfg):
    """Set the knobs of ``cfg`` (those present) on ``reducer``; return the wire dtype to use."""
    if 'shared' in cfg or 'shm_chunk' in cfg:
        reducer.configure(shared=cfg.get('shared'), chunk_bytes=cfg.get('shm_chunk'))
    if 'chunk' in cfg:
        reducer.chunked.chunk_bytes = cfg['chunk']
    return cfg.get('dtype')


class CallTuning:
    """The :class:`Tuner` of one kind of call, set up after its first call (a warm-up with ``initial``).

    ``axes_fn()`` returns the axes; it runs after the first call, when the reducer knows its
    path.  Use :meth:`begin` (returns the call's configuration) and :meth:`end` around each call.
    """

    def __init__(self, mpi_comm, what, axes_fn, initial, on_decided=None):
        self.mpi_comm = mpi_comm
        self.what = what
        self._axes_fn = axes_fn
        self.initial = dict(initial)
        self.tuner = None
        #: Called after each schedule (e.g. to free the buffers of the values not chosen).
        self.on_decided = on_decided

    @property
    def choice(self):
        """The configuration chosen so far (``initial`` before the first decision)."""
        return self.initial if self.tuner is None else self.tuner.choice

    @property
    def timing(self):
        """Whether this call's time is measured (warm-up or schedule): wait for device work first."""
        return self.tuner is None or self.tuner.tuning

    def begin(self):
        """Return the configuration of this call (a dict) and start its clock."""
        if self.tuner is None:
            return self.initial
        return self.tuner.config()

    def end(self):
        """Record this call; after the first one, set up the schedule (collective)."""
        if self.tuner is None:
            self.tuner = Tuner(self.mpi_comm, self.what, self._axes_fn(), self.initial)
            self.tuner.record(0.0)
            return
        was = self.tuner.tuning
        self.tuner.record()
        if was and not self.tuner.tuning and self.on_decided is not None:
            self.on_decided()


def wire_axes():
    """Return the axes of a wire format tuned alone (``'auto'`` on the GPU communicators)."""
    return [('dtype', lambda c: _first(c.get('dtype'), WIRE_CHOICES))]


class TunedMean:
    """``NodeReducer.mean`` of the plain path (``multi_node_mean_grad``) under a :class:`Tuner`."""

    def __init__(self, reducer, grad_dtype, what='multi_node_mean_grad'):
        self.reducer = reducer
        self.grad_dtype = grad_dtype
        self.what = what
        self._active = reducer.mpi_comm.Get_size() > 1 and (is_auto(grad_dtype) or knobs_tunable())
        self.tuning = self._new_tuning({'dtype': None if is_auto(grad_dtype) else grad_dtype})
        #: One schedule per set of gradients, by (arrays, elements): another model tunes anew.
        self._by_sizes = {}

    def _new_tuning(self, initial):
        reducer, grad_dtype = self.reducer, self.grad_dtype
        return CallTuning(reducer.mpi_comm, self.what,
                          lambda: reducer_axes(reducer, grad_dtype, knobs_tunable()), initial,
                          reducer.release_unused)

    @property
    def dtype(self):
        """The wire dtype in use now (``'auto'`` resolved to the current choice)."""
        if not is_auto(self.grad_dtype):
            return self.grad_dtype
        return self.tuning.choice.get('dtype')

    def mean(self, arrays):
        """Average host ``arrays`` in place with the configuration the schedule gives this call."""
        if not self._active:
            self.reducer.mean(arrays, dtype=self.dtype)
            return
        sizes = (len(arrays), sum(a.size for a in arrays))
        tuning = self._by_sizes.get(sizes)
        if tuning is None:
            if self._by_sizes:  # another set of gradients: its own schedule, from the choice so far
                tuning = self._new_tuning(self.tuning.choice)
                if len(self._by_sizes) >= _SETS:
                    self._by_sizes.pop(next(iter(self._by_sizes)))
            else:
                tuning = self.tuning
            self._by_sizes[sizes] = tuning
        self.tuning = tuning
        dtype = apply_reducer_config(self.reducer, self.tuning.begin())
        self.reducer.mean(arrays, dtype=dtype)
        self.tuning.end()
