"""``'auto'`` as a hook: the tuner picks the fastest average on the job's own calls.

``Auto()`` is ``allreduce_grad_dtype='auto'``: exact float32, float16 or bfloat16 on the wire,
the same bits as that path.  ``Auto(powersgd=PowerSGD(...))`` also lets PowerSGD compete, which
changes the average (an approximation): only when the user passes it, never by default.  Until
PowerSGD's ``start_update``, and until the ``'auto'`` wire has chosen its wire and knobs, every
update is averaged by that wire; then one update warms PowerSGD up and the schedule of
``reduce.tune`` times the tuned wire against PowerSGD on whole updates (with ``overlap=True``:
from the first bucket of an update to the end of its last), compute included, every rank
agreeing on the slowest rank's times, and keeps the faster (PowerSGD must win by the tuner's
margin); it runs again at update 1000 and every 10,000 after.  When PowerSGD is left for the
wire, what its error memories hold is added to the next average rather than dropped.
"""

from chainermn_comm import _arrays
from chainermn_comm.hooks.base import CommHook, WireHook
from chainermn_comm.reduce import tune as _tune

__all__ = ['Auto']


class Auto(WireHook):
    """Average with whichever of the exact, float16 and bfloat16 wires (and ``powersgd``) is fastest.

    Args:
        powersgd: a :class:`~chainermn_comm.hooks.PowerSGD` allowed to compete (None: the wires only,
            exactly ``allreduce_grad_dtype='auto'``).
    """

    def __init__(self, powersgd=None):
        super().__init__('auto')
        if powersgd is not None and not isinstance(powersgd, CommHook):
            raise TypeError('Auto(powersgd=...) takes a chainermn.hooks.PowerSGD; got {!r}'.format(powersgd))
        self.powersgd = powersgd
        self._tuning = None
        self._updates = 0
        self._config = None
        self._from = None  # the hook of the last update (to flush PowerSGD's memories on a switch)
        self._timed = False
        self._auto_wire = _AutoWire(self)

    @property
    def is_wire(self):
        return self.powersgd is None

    @property
    def stateful(self):
        """With PowerSGD it keeps its memories and its tuner for one model."""
        return self.powersgd is not None

    @property
    def name(self):
        return 'auto' if self.powersgd is None else 'auto+{}'.format(self.powersgd)

    @property
    def choice(self):
        """The hook chosen so far (the ``'auto'`` wire before the first schedule)."""
        if self._tuning is None:
            return self._auto_wire if self.powersgd is not None else self
        return self._tuning.choice['hook']

    def __call__(self, comm, bucket):
        if self.powersgd is None:
            return super().__call__(comm, bucket)
        if bucket.first:
            self._updates += 1
            self._config = self._begin(comm)
        hook = self._config
        if self._from is self.powersgd and hook is not self.powersgd:
            _flush(self.powersgd, bucket)
        hook(comm, bucket)
        if bucket.last:
            self._end(bucket)
            self._from = hook

    def _begin(self, comm):
        """Return the hook of this update and start its clock (once the schedule may run).

        The ``'auto'`` wire first runs its own schedule (the wire and the knobs); then one update
        warms PowerSGD up (its buffers and error memories: untimed, the schedule's warm-up); then
        the schedule times the tuned wire against PowerSGD.
        """
        p = self.powersgd
        if self._tuning is None:
            averaging = getattr(comm, 'averaging', None)
            wire_ready = True if averaging is None else averaging.wire_tuned('auto')
            if self._updates <= getattr(p, 'start_update', 0) or not wire_ready:
                return self._auto_wire
            p.updates = max(p.updates, getattr(p, 'start_update', 0))  # compresses from its first call
            choices = (self._auto_wire, p)
            self._tuning = _tune.CallTuning(
                comm.mpi_comm, 'comm_hook auto', lambda: [('hook', lambda c: _tune.first(c['hook'], choices))],
                {'hook': self._auto_wire})
            self._timed = True
            return p  # the warm-up: PowerSGD's first call allocates what it keeps
        self._timed = True
        return self._tuning.begin()['hook']

    def _end(self, bucket):
        if self._tuning is None or not self._timed:
            return
        self._timed = False
        if self._tuning.timing and bucket.grads and _arrays.is_device(bucket.grads[0]):
            import cupy
            cupy.cuda.get_current_stream().synchronize()  # the device work, not its queueing
        self._tuning.end()

    def serialize(self, serializer):
        """Save or load PowerSGD's state (under ``powersgd/``); the tuner starts anew after a load."""
        if self.powersgd is not None:
            self.powersgd.serialize(serializer['powersgd'])


class _AutoWire(CommHook):
    """The ``'auto'`` wire of an :class:`Auto`: float32, float16 or bfloat16, tuned with the knobs."""

    name = 'auto'

    def __init__(self, auto):
        self.auto = auto

    def __call__(self, comm, bucket):
        WireHook.__call__(self.auto, comm, bucket)


def _flush(powersgd, bucket):
    """Add PowerSGD's error memories of ``bucket``'s gradients to them, and clear the memories."""
    for name, g in zip(bucket.names, bucket.grads):
        err = powersgd._error.get(name)
        if err is not None and err.size == g.size:
            g += err.reshape(g.shape)
            err[...] = 0
