"""The multi-node optimizer's finite check: name the rank whose gradient holds NaN or Inf.

With ``check_finite='skip'`` or ``'raise'`` (or ``CHAINERMN_CHECK_FINITE``), every rank looks at
its own gradients before they are averaged (one reduction per array: ``dot(g, g)``, or a
float32 sum for float16, whose squares overflow early; an array whose result is not finite is
confirmed with ``isfinite``) and makes one int of it: 0, or 1 + the index of its first
non-finite parameter in name order.  That int rides on the gradient average's own agreement
check (``chainermn_comm.engine.mark_next_collective``: no message of its own; an ``allgather_obj``
where the check carries none), so after the average every rank knows which ranks' local
gradients held NaN or Inf, and in which parameter.  Then every rank skips the update
(``'skip'``, as loss scaling does: no parameter changes, ``t`` does not advance; with Chainer's
dynamic loss scaling the wrapped optimizer's own update runs instead, which skips it and lowers
the scale) or raises ``FloatingPointError`` (``'raise'``).  The check reads every gradient once
more: see docs/troubleshooting.md for what it costs, which is why it is off by default.
"""

import math

from chainermn_comm import engine, settings
from chainermn_comm.log import get_logger
from chainermn_comm.protocol import CHECK_FINITE_ENV

__all__ = ['resolve_mode', 'first_nonfinite', 'FiniteCheck', 'MODES']

#: The modes ``check_finite`` takes (None or 'off': no check).
MODES = ('skip', 'raise')
#: Skips reported one by one; after that one line every ``_REPORT_EVERY`` skips.
_REPORT_FIRST = 10
_REPORT_EVERY = 100

_log = get_logger('train')


def resolve_mode(check_finite):
    """Return 'skip', 'raise' or None (off) for the argument; None takes ``CHAINERMN_CHECK_FINITE``."""
    if check_finite is None:
        check_finite = settings.read(CHECK_FINITE_ENV)
    if check_finite is False or check_finite == 'off':
        return None
    if check_finite in MODES:
        return check_finite
    raise ValueError("create_multi_node_optimizer: check_finite must be 'skip', 'raise', 'off' or None "
                     "(None: ${}, default off); got {!r}".format(CHECK_FINITE_ENV, check_finite))


def _scalar(g):
    """Return one number that is finite when every element of ``g`` is (on the array's device)."""
    v = g.reshape(-1)
    if v.dtype.itemsize < 4:
        return v.sum(dtype='float32')
    return v.dot(v)


def first_nonfinite(params):
    """Return 1 + the index of the first parameter whose gradient holds NaN or Inf, else 0.

    ``params``: the parameters in name order; those without a gradient are skipped.
    """
    found = [(i, p.grad) for i, p in enumerate(params) if p.grad is not None]
    if not found:
        return 0
    xp = _array_module(found[0][1])
    values = [_scalar(g) for _, g in found]
    if xp is not None:  # one transfer from the device for all of them
        values = xp.stack([xp.asarray(v, dtype='float64') for v in values]).get().tolist()
    for (i, g), v in zip(found, values):
        if not math.isfinite(float(v)):
            mod = xp if xp is not None else _numpy()
            if not bool(mod.isfinite(g).all()):  # a huge but finite gradient overflows its square
                return i + 1
    return 0


def _numpy():
    import numpy
    return numpy


def _array_module(array):
    """Return cupy for a CuPy array, else None."""
    module = type(array).__module__
    if module.startswith('cupy'):
        import cupy
        return cupy
    return None


class FiniteCheck:
    """One multi-node optimizer's finite check: mark before the average, judge after it."""

    def __init__(self, communicator, mode):
        self.communicator = communicator
        self.mode = mode
        #: Updates skipped because some rank's gradient held NaN or Inf.
        self.skipped = 0
        self._word = 0
        self._carried = False

    def before(self, target):
        """Look at this rank's gradients of ``target``; hand the result to the next collective."""
        self._names_params = sorted(target.namedparams(), key=lambda kv: kv[0])
        self._word = first_nonfinite([p for _, p in self._names_params])
        self._carried = self.communicator.size > 1 and \
            engine.mark_next_collective(self.communicator, self._word)

    def after(self, t):
        """Return the message naming the ranks whose gradients held NaN or Inf at update ``t``, or None."""
        comm = self.communicator
        if comm.size == 1:
            words = [self._word]
        elif self._carried:
            words = engine.collective_marks(comm)
        else:
            words = comm.allgather_obj(self._word)
        bad = [(r, w - 1) for r, w in enumerate(words or ()) if w]
        if not bad:
            return None
        hosts = engine.rank_hosts(comm)
        names = [n for n, _ in self._names_params]
        where = ', '.join("rank {}{} (first in '{}')".format(
            r, ' (host {})'.format(hosts[r]) if hosts else '', names[i] if i < len(names) else i)
            for r, i in bad)
        return ('non-finite gradient at update {}: NaN or Inf in the local gradient of {}; averaging '
                'would spread it to every rank'.format(t + 1, where))

    def skip(self, message):
        """Count a skipped update and log it on rank 0 (the first ones, then every 100th)."""
        self.skipped += 1
        n = self.skipped
        if self.communicator.rank == 0 and (n <= _REPORT_FIRST or n % _REPORT_EVERY == 0):
            _log.warning('%s; this update is skipped on every rank (check_finite=\'skip\'; %d '
                         'skipped so far)', message, n)
