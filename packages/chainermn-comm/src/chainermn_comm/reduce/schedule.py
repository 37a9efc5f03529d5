"""The tuner's schedule: time each axis of a configuration over a job's own calls, within a bound.

A :class:`Tuner` runs a schedule over the first calls of a gradient average.  Call 1 is a
warm-up (buffers, shared memory, page faults) with the defaults.  Then, one *axis* at a time
(the wire format when ``allreduce_grad_dtype='auto'``, shared memory on or off, the shared-memory
chunk, the MPI chunk; the overlap path adds its mode and bucket size), the values of the axis are
timed in rounds of one call each (rounds alternate direction), the other axes held at their
current choice.  After each round one ``Allreduce(MAX)`` of the local times gives every rank the
slowest rank's times.  What a schedule may cost is bounded:

- a configuration timed on an earlier axis (the current choice) is not timed again: its times
  carry over;
- a value more than ``DROP_FIRST`` (2) times slower than the best call seen in the schedule is
  not timed again in it (a float16 wire on a fast link costs one update, not three); after a
  value's second call, or the first of the current value (which ran before: the warm-up, an
  earlier axis), one more than ``DROP`` times slower than the best of its axis is out too;
- the schedule takes at most ``MAX_CALLS`` (10) calls, its warm-up included: a value gets another
  round (up to ``SAMPLES`` calls) only while the first calls of the later axes still fit whichever
  value of the race wins it (the later axes may depend on the winner), and an
  axis whose first calls do not fit keeps its current value (logged as such).

The first call of a value also pays for its own buffers (a new wire's first call was measured at
up to 1.75x its steady time on the namespace cluster), which is why one call more than 2x the best
is the limit, not less; ml_dtypes, which the bfloat16 wire casts with where installed, is imported
before the schedule starts.  Each value scores the best of its samples, and a challenger replaces
the current value only when it is more than ``MARGIN`` faster.  Every rank follows the same
schedule and computes the same choice from the same numbers, so the ranks never disagree on a
configuration, and the collectives of each call match.  Every configuration averages correctly,
so the calls that tune are real updates.

The schedule runs again at call ``RECHECK_FIRST`` and then every ``RECHECK_EVERY`` calls, so a
link that became faster or slower (another job sharing it) is followed.  Each set of gradients
(their count and size) that the plain path averages has its own schedule (another model tunes
anew, with a warm-up, from the choice so far).  The first decision is
logged on rank 0 (``chainermn.tune``), later ones only when the choice changed; with tracing on
(``chainermn_comm.trace``) each decision is also a trace event.

What is tuned (the axes) lives with the code that uses it: ``reduce.tune`` for the host average,
``chainermn_train``'s overlap tuner for ``overlap=True``.
"""

import time
import zlib

import numpy

from chainermn_comm._errors import CommunicationError

__all__ = ['Tuner', 'label', 'decision', 'SAMPLES', 'DROP', 'DROP_FIRST', 'MARGIN', 'MAX_CALLS', 'RECHECK_FIRST',
           'RECHECK_EVERY']

#: Calls timed per value of an axis, at most (one per round).
SAMPLES = 3
#: A value this many times slower than the best call seen in the schedule is not timed again.
DROP_FIRST = 2.0
#: A value this many times slower than the best of its axis after its second call is not timed again.
DROP = 1.25
#: A challenger must be this much faster than the current value to replace it.
MARGIN = 0.03
#: Calls a schedule takes at most (the first schedule's warm-up call included).
MAX_CALLS = 10
#: The call at which the schedule first runs again, and the period after that.
RECHECK_FIRST = 1000
RECHECK_EVERY = 10000


#: What a tuner's decision line calls the average it tuned (by the tuner's ``what``).
_SUBJECTS = {'multi_node_mean_grad': 'gradient averaging',
             'multi_node_mean_grad(overlap)': 'gradient averaging during backward (overlap)',
             'multi_node_mean_grad(device)': 'gradient averaging on the GPUs',
             'comm_hook auto': 'communication hook Auto'}


def _size(value):
    return label(value).replace('KiB', ' KiB').replace('MiB', ' MiB')


def decision(what, choice, changed=False):
    """Return the one line a user reads about a tuner's choice ('gradient averaging: float32, ...')."""
    parts = []
    for name, value in sorted(choice.items(), key=lambda kv: _ORDER.get(kv[0], len(_ORDER))):
        if name == 'dtype':
            parts.append(label(value))
        elif name == 'shared':
            parts.append('node-shared memory' if value else 'MPI messages')
        elif name == 'shm_chunk':
            if choice.get('shared', True):
                parts.append('{} shared-memory chunks'.format(_size(value)))
        elif name == 'chunk':
            parts.append('{} MPI chunks'.format(_size(value)))
        elif name == 'bucket':
            parts.append('{} buckets'.format(_size(value)))
        elif name == 'hook':
            parts.append(label(value))
        else:
            parts.append('{} {}'.format(name, label(value)))
    return '{}{}: {}'.format(_SUBJECTS.get(what, what), ' (changed)' if changed else '', ', '.join(parts))


_ORDER = {'hook': 0, 'dtype': 1, 'mode': 2, 'shared': 3, 'shm_chunk': 4, 'chunk': 5, 'bucket': 6}


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
        #: Calls up to (not including) this one run no schedule and need no :meth:`config` and
        #: :meth:`record` (a caller may count them in ``calls`` itself); 0 while a schedule runs.
        self.quiet_until = 0
        self._axis = -1     # index into ``axes`` of the axis being timed, -1: none
        self._values = ()
        self._queue = []
        self._times = None
        self._round = 0
        self._trying = None
        self._figures = {}
        self._skipped = []
        self._seen = {}     # configuration -> the slowest rank's times, this schedule
        self._best = numpy.inf
        self._used = 0      # calls of this schedule so far
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
            self._used += 1
            if not self._queue:
                self._round_done()
        elif self._axis < 0 and self.calls == self._next_run:
            self._figures, self._skipped, self._seen, self._best = {}, [], {}, numpy.inf
            self._used = 1 if self.calls == 1 else 0  # the first schedule counts its warm-up call
            self._axis = -1
            self.quiet_until = 0
            self._next_axis()

    # -- the schedule ---------------------------------------------------------------------------
    @staticmethod
    def _keys(choice, name, value, first):
        """Return the keys of the configuration ``choice`` with axis ``name`` at ``value``.

        The first value of an axis is its current one: an axis not in ``choice`` yet is at it,
        so that configuration is also ``choice`` itself.
        """
        def key(cfg):
            return tuple(sorted((k, label(v)) for k, v in cfg.items()))
        keys = [key(dict(choice, **{name: value}))]
        if first and name not in choice:
            keys.append(key(choice))
        return keys

    def _known(self, choice, name, value, first):
        """Return the times of a configuration seen in this schedule ([] if none)."""
        for k in self._keys(choice, name, value, first):
            if k in self._seen:
                return list(self._seen[k])
        return []

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
            # A configuration timed on an earlier axis (the current choice) is not timed again.
            times = [self._known(self.choice, name, v, i == 0) for i, v in enumerate(values)]
            first = [i for i, t in enumerate(times) if not t]
            if self._used + len(first) > MAX_CALLS:
                self._skipped.append(name)  # no calls left for it: keep its current value
                continue
            self._values, self._times, self._round = values, times, 0
            if first:
                self._queue = first
                return
            self._round_done()
            return

    def _reserve(self, leader):
        """Return the calls the first rounds of the later axes need if value ``leader`` wins this one."""
        name = self.axes[self._axis][0]
        choice = dict(self.choice, **{name: self._values[leader]})
        need = 0
        for later, values_fn in self.axes[self._axis + 1:]:
            values = tuple(values_fn(choice))
            if len(values) >= 2:
                need += sum(not self._known(choice, later, v, i == 0) for i, v in enumerate(values))
        return need

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
            t[i, :len(times)] = times[:SAMPLES]
        self.mpi_comm.Allreduce(MPI.IN_PLACE, t, MPI.MAX)  # the slowest rank's time of each call
        name = self.axes[self._axis][0]
        for i, v in enumerate(self._values):
            self._times[i] = [float(x) for x in t[i] if numpy.isfinite(x)]
            for k in self._keys(self.choice, name, v, i == 0):
                self._seen[k] = self._times[i]
        best = t.min(axis=1)
        self._best = min(self._best, float(best.min()))
        self._round += 1
        # Out for this schedule: DROP_FIRST x the best time seen in it; DROP x the best of this
        # axis after a value's second call, or after the first call of the current value (it ran
        # before, e.g. as the warm-up: its buffers are paid for).
        race = [i for i in range(len(best)) if best[i] <= DROP_FIRST * self._best and (
            (len(self._times[i]) < 2 and i > 0) or best[i] <= DROP * best.min())]
        more = [i for i in race if len(self._times[i]) < SAMPLES]
        # Any value still in the race (or the current one, by the margin) may win the next round:
        # keep the first calls of the later axes free whichever it is.
        reserve = max(self._reserve(i) for i in set(race) | {0}) if len(race) > 1 and more else 0
        if len(race) > 1 and more and self._used + len(more) + reserve <= MAX_CALLS:
            # Rounds alternate direction, so no value always follows the same other value.
            self._queue = more if self._round % 2 == 0 else more[::-1]
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
        self.quiet_until = self._next_run
        previous = self.history[-1][2] if self.history else None
        self.history.append((self.calls, self._figures, dict(self.choice)))
        if not self._figures:
            return
        changed = previous is not None and previous != self.choice
        figures = {axis: {k: round(v * 1e3, 3) for k, v in f.items()} for axis, f in self._figures.items()}
        if self.mpi_comm.Get_rank() == 0 and (previous is None or changed):
            from chainermn_comm.log import get_logger
            log = get_logger('tune')
            log.info('%s', decision(self.what, self.choice, changed))   # the table: debug level
            log.debug(
                '%s tuned at call %d (%d calls): %s; ms per value (slowest rank, best of up to %d '
                'calls): %s%s; next check at call %d', self.what, self.calls, self._used,
                ', '.join('{}={}'.format(k, label(v)) for k, v in sorted(self.choice.items())),
                SAMPLES, figures, '; no calls left for: ' + ', '.join(self._skipped)
                if self._skipped else '', self._next_run)
        _trace({'what': self.what, 'call': self.calls, 'changed': changed, 'calls': self._used,
                'choice': {k: label(v) for k, v in self.choice.items()}, 'ms': figures,
                'skipped': list(self._skipped)})
