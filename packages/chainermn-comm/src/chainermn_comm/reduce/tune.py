"""Tune the gradient average on the job's own gradients: the wire format and the knobs.

The schedule (``reduce.schedule``, re-exported here) times each *axis* of the configuration over
the first calls, the same on every rank, within a bound of 10 calls; this module says what the
axes of the host average are and runs them.

What may be tuned never changes results beyond what the user allowed:

- the wire format only with ``allreduce_grad_dtype='auto'``, which permits float16 and bfloat16
  (``None`` stays the gradients' own dtype, exact); not on one node that averages through
  shared memory, where nothing crosses a wire; on the host only one 16-bit wire is a contender,
  the one whose casts are cheaper (:func:`host_wire_choices`: both send the same bytes);
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

import numpy

from chainermn_comm.reduce import codecs as _codecs
from chainermn_comm.reduce import chunked as _grad
from chainermn_comm.reduce import node_shared as _shm_reduce
from chainermn_comm.reduce.schedule import (DROP, DROP_FIRST, MARGIN, MAX_CALLS, RECHECK_EVERY,
                                            RECHECK_FIRST, SAMPLES, Tuner, label)
from chainermn_comm import settings
from chainermn_comm.protocol import SHM_REDUCE_ENV, TUNE_ENV

__all__ = ['Tuner', 'CallTuning', 'first', 'TunedMean', 'wire_axes', 'reducer_axes', 'apply_reducer_config',
           'knobs_tunable', 'is_auto', 'AUTO', 'WIRE_CHOICES', 'host_wire_choices', 'label', 'SAMPLES', 'DROP', 'DROP_FIRST',
           'MARGIN', 'MAX_CALLS', 'RECHECK_FIRST', 'RECHECK_EVERY']

AUTO = 'auto'
#: The wire formats ``'auto'`` chooses from: the gradients' own dtype (exact), float16, bfloat16.
WIRE_CHOICES = (None, numpy.dtype(numpy.float16), _codecs.BFLOAT16_NAME)
#: Sets of gradients whose schedules the plain path keeps (the oldest is forgotten).
_SETS = 4
#: Elements of the sample whose casts decide which 16-bit wire ``'auto'`` tries on the host.
_CAST_SAMPLE = 1 << 16
#: float16 is tried on the host only when its casts take less than this share of bfloat16's.
_FLOAT16_SHARE = 0.8


def is_auto(grad_dtype):
    """Return whether ``grad_dtype`` (an ``allreduce_grad_dtype``) asks the tuner to choose the wire."""
    return isinstance(grad_dtype, str) and grad_dtype == AUTO


def knobs_tunable():
    """Return whether knobs that are not pinned are tuned (``CHAINERMN_TUNE``, default on)."""
    return bool(settings.read(TUNE_ENV))


def _cast_seconds(codec, x):
    """Return the best of three round trips of float32 ``x`` through ``codec`` (seconds)."""
    wire = numpy.empty(x.size, dtype=codec.storage)
    back = numpy.empty_like(x)
    best = float('inf')
    for _ in range(3):
        start = time.perf_counter()
        codec.encode(wire, x)
        codec.decode(back, wire)
        best = min(best, time.perf_counter() - start)
    return best


def host_wire_choices(mpi_comm):
    """Return the wires ``'auto'`` tries on the host: float32 and the one 16-bit wire with cheaper casts.

    float16 and bfloat16 send the same bytes, so on the host only their casts differ; timing one
    round trip of a 256 KiB sample through each (summed over the ranks, so that every rank
    agrees) keeps a whole update of the slower one out of the schedule.  float16 is kept only
    when its casts take less than 0.8x bfloat16's (it also needs a scaling pass).  Collective.
    """
    from mpi4py import MPI
    x = numpy.linspace(-4.0, 4.0, _CAST_SAMPLE, dtype=numpy.float32)
    t = numpy.array([_cast_seconds(_codecs.FLOAT16, x), _cast_seconds(_codecs.BFLOAT16, x)])
    mpi_comm.Allreduce(MPI.IN_PLACE, t, MPI.SUM)
    half = numpy.dtype(numpy.float16) if t[0] < _FLOAT16_SHARE * t[1] else _codecs.BFLOAT16_NAME
    return (None, half)


# -- the host reducer's axes ------------------------------------------------------------------
def first(current, values):
    """Return ``values`` with ``current`` first (added when missing): an axis's values, the current one first.

    Values are told apart by how they are written (:func:`label`): ``numpy.float16`` and
    ``dtype('float16')`` are one value; so are two hooks of the same name.  Every tuner's axes
    (the host average, ``overlap=True``, ``hooks.Auto``) use this one comparison.
    """
    return (current,) + tuple(v for v in values if label(v) != label(current))


_first = first  # the older name (tests use it)


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
        wires = host_wire_choices(reducer.mpi_comm)

        def dtype(c):
            if reducer.shared_usable and reducer.topology.inter_size == 1:
                return ()  # one node averages in shared memory: no wire, nothing to choose
            return first(c.get('dtype'), wires)
        axes.append(('dtype', dtype))
    if not knobs:
        return axes

    def shared(c):
        exact = _codecs.codec_of(c.get('dtype')) is None
        if not reducer.shared_usable or settings.is_set(SHM_REDUCE_ENV) or size != 2 \
                or not exact:
            return ()
        return first(reducer.use_shared, (True, False))

    def shm_chunk(c):
        if not (reducer.shared_usable and c.get('shared', reducer.use_shared)) or reducer.chunk_pinned:
            return ()
        return first(reducer.chunk_bytes, _shm_reduce.SHM_CHUNK_CHOICES)

    def chunk(c):
        chunked = reducer.chunked
        lossy = _codecs.codec_of(c.get('dtype')) is not None
        uses_mpi = not (reducer.shared_usable and c.get('shared', reducer.use_shared))
        if not uses_mpi or chunked.chunk_pinned or not (size == 2 or lossy):
            return ()
        return first(chunked.chunk_bytes, _grad.LOSSY_CHUNK_CHOICES if lossy else _grad.CHUNK_CHOICES)
    axes += [('shared', shared), ('shm_chunk', shm_chunk), ('chunk', chunk)]
    return axes


def apply_reducer_config(reducer, cfg):
    """Set the knobs of ``cfg`` (those present) on ``reducer``; return the wire dtype to use."""
    reducer.tuned_by = None
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
        #: The wire of the settled choice, once it is set on the reducer (``TunedMean``).
        self.dtype = None

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
    return [('dtype', lambda c: first(c.get('dtype'), WIRE_CHOICES))]


class TunedMean:
    """``NodeReducer.mean`` of the plain path (``multi_node_mean_grad``) under a :class:`Tuner`.

    Once a schedule has decided, the choice is set on the reducer (``reducer.tuned_by`` names
    this tuning) and the calls until the next check need no tuner: the averaging interface
    (``chainermn_comm.averaging``) runs them straight on the reducer, counting them in
    ``tuning.tuner.calls``, while ``by_sizes`` and ``reducer.tuned_by`` say so.
    """

    def __init__(self, reducer, grad_dtype, what='multi_node_mean_grad'):
        self.reducer = reducer
        self.grad_dtype = grad_dtype
        self.what = what
        #: Whether anything is tuned (more than one rank, and a wire or a knob to choose).
        self.active = reducer.mpi_comm.Get_size() > 1 and (is_auto(grad_dtype) or knobs_tunable())
        self.tuning = self._new_tuning({'dtype': None if is_auto(grad_dtype) else grad_dtype})
        #: One schedule per set of gradients, by (arrays, elements): another model tunes anew.
        self.by_sizes = {}
        self._by_sizes = self.by_sizes  # the older name (tests read it)

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
        if not self.active:
            self.reducer.mean(arrays, dtype=self.dtype)
            return
        sizes = (len(arrays), sum(a.size for a in arrays))
        tuning = self.by_sizes.get(sizes)
        if tuning is None:
            if self.by_sizes:  # another set of gradients: its own schedule, from the choice so far
                tuning = self._new_tuning(self.tuning.choice)
                if len(self.by_sizes) >= _SETS:
                    self.by_sizes.pop(next(iter(self.by_sizes)))
            else:
                tuning = self.tuning
            self.by_sizes[sizes] = tuning
        self.tuning = tuning
        dtype = apply_reducer_config(self.reducer, self.tuning.begin())
        self.reducer.mean(arrays, dtype=dtype)
        self.tuning.end()
        tuner = tuning.tuner
        if tuner is not None and not tuner.tuning:  # settled: set the choice for the calls to come
            tuning.dtype = apply_reducer_config(self.reducer, tuner.choice)
            self.reducer.tuned_by = tuning
