"""Tune ``overlap=True`` on the job's own updates: wire format, mode, bucket size, reducer knobs.

The driver, the schedule and the agreement are comm's (``chainermn_comm.engine.CallTuning``,
the one tuning driver of the plain path, overlap and ``hooks.Auto``): the first update warms up
with the defaults, then each axis is timed over a few whole ``run_backward`` calls (backward and
the average it hides, the slowest rank's time) and the fastest value kept, the same on every
rank.  Axes, in order: the wire format (``allreduce_grad_dtype='auto'``), the mode (``thread``,
``inline``, ``end``), the bucket size (not for ``end``), then the node reducer's knobs (shared
memory, chunk sizes; see ``chainermn_comm.reduce.tune``).  None of them changes the bits of the
average (tested), except the wire, which ``'auto'`` allows.  ``CHAINERMN_OVERLAP_MODE`` and
``CHAINERMN_OVERLAP_BUCKET_BYTES`` pin theirs; ``CHAINERMN_TUNE=0`` pins every knob.
"""

from chainermn_comm import engine, protocol, settings

__all__ = ['OverlapTuning', 'MODE_CHOICES', 'BUCKET_CHOICES']

#: When host buckets may be averaged (see ``_overlap.MODES``).
MODE_CHOICES = ('thread', 'inline', 'end')
#: Bucket sizes the tuner may choose from.
BUCKET_CHOICES = (1 << 20, 4 << 20, 16 << 20)


class OverlapTuning:
    """The tuner of one :class:`~chainermn_train._overlap.BackwardOverlap` (host gradients)."""

    def __init__(self, overlap, mpi_comm, reducer, hook_run, bucket_pinned):
        """Tune ``overlap`` (its mode, bucket size and wire), which averages on ``mpi_comm`` through ``reducer``."""
        self.overlap, self.reducer = overlap, reducer
        self.grad_dtype = overlap.wire  # the communicator's allreduce_grad_dtype, or a built-in hook's
        knobs = engine.knobs_tunable()
        self.bucket_pinned = bucket_pinned or not knobs
        self.mode_pinned = settings.is_set(protocol.OVERLAP_MODE_ENV) or not knobs
        self.active = mpi_comm.Get_size() > 1 and not hook_run and (
            engine.is_auto(self.grad_dtype) or knobs)
        self.dtype = None if engine.is_auto(self.grad_dtype) else self.grad_dtype
        initial = {'dtype': self.dtype, 'mode': overlap.mode, 'bucket': overlap.bucket_bytes}
        #: The driver: ``begin`` gives each call's configuration, ``end`` records its time.
        self.driver = engine.CallTuning(mpi_comm, 'multi_node_mean_grad(overlap)', self._axes,
                                        initial, reducer.release_unused)

    @property
    def tuner(self):
        """The schedule (None until the first call has ended)."""
        return self.driver.tuner

    def _axes(self):
        ov = self.overlap
        axes = engine.reducer_axes(self.reducer, self.grad_dtype, engine.knobs_tunable())
        rest = axes[1:] if engine.is_auto(self.grad_dtype) else axes
        mine = axes[:len(axes) - len(rest)]
        if not self.mode_pinned:
            mine.append(('mode', lambda c: engine.first(ov.mode, MODE_CHOICES)))
        if not self.bucket_pinned:
            mine.append(('bucket', lambda c: () if c.get('mode', ov.mode) == 'end'
                         else engine.first(ov.bucket_bytes, BUCKET_CHOICES)))
        return mine + rest

    def begin(self):
        """Set the configuration of this call (mode, bucket size, knobs, wire) and start its clock."""
        if self.driver.tuner is None:
            return  # the first call warms up with the defaults
        cfg = self.driver.begin()
        ov = self.overlap
        self.dtype = engine.apply_reducer_config(self.reducer, cfg)
        ov.bucket_bytes = cfg.get('bucket', ov.bucket_bytes)
        ov.set_mode(cfg.get('mode', ov.mode))

    def end(self):
        """Record this call's time; after the first call, set up the schedule (collective)."""
        self.driver.end()
