"""The communication-hook interface: what averages a model's gradients, or a bucket of them.

A hook is called once per average with the communicator and a :class:`GradBucket`, and leaves
the bucket's arrays averaged (or approximated) over the communicator's ranks, in place.  Every
rank calls its hook with the same arrays (shapes, dtypes, order) at the same point, so the
collectives a hook runs match.  A hook keeps its own state in its attributes; what
:meth:`CommHook.serialize` writes is saved with the optimizer (and so by the checkpointer).
"""

import numpy

from chainermn_comm.reduce import dtypes as _dtypes

__all__ = ['CommHook', 'GradBucket', 'WireHook', 'FunctionHook', 'mean', 'RANK_MEAN']

#: The key under which a hook serializes its per-rank state (e.g. PowerSGD's error memories):
#: a job resumed on another number of ranks gives every new rank the mean of the old ranks' values.
RANK_MEAN = 'rank_mean'


class GradBucket:
    """The gradients one hook call averages: all of a model's, or one bucket (``overlap=True``).

    Attributes:
        grads (list): C-contiguous arrays (NumPy or CuPy) to leave averaged over ranks, in place.
        names (list): the parameters' names, in the same order (the same on every rank).
        index (int): the bucket's number within this update (0 for a whole model).
        count (int): the number of buckets of this update (1 for a whole model).
    """

    __slots__ = ('grads', 'names', 'index', 'count')

    def __init__(self, grads, names, index=0, count=1):
        self.grads = list(grads)
        self.names = list(names)
        self.index = int(index)
        self.count = int(count)
        if len(self.grads) != len(self.names):
            raise ValueError('GradBucket got {} gradients but {} names'.format(
                len(self.grads), len(self.names)))

    @property
    def first(self):
        """Whether this is the first bucket of an update (a hook's update counter moves here)."""
        return self.index == 0

    @property
    def last(self):
        """Whether this is the last bucket of an update."""
        return self.index == self.count - 1

    @property
    def nbytes(self):
        """Bytes of gradient in the bucket."""
        return int(sum(g.nbytes for g in self.grads))

    def __repr__(self):
        return '<GradBucket {}/{}: {} arrays, {} bytes>'.format(
            self.index + 1, self.count, len(self.grads), self.nbytes)


class CommHook:
    """Base class of communication hooks: average a :class:`GradBucket` over the communicator's ranks.

    Override :meth:`__call__`; keep state in attributes and override :meth:`serialize` to save it.
    Inside a hook, average arrays with :func:`mean` (the hook already runs inside the
    communicator's checked call: do not call the communicator's own collectives from it).
    """

    #: The hook's name in traces, logs and the tuner (``str(hook)``).
    name = 'hook'
    #: Whether the hook is a built-in wire (an exact average whose terms cross in :attr:`wire`).
    is_wire = False
    #: The wire of a built-in wire hook (an ``allreduce_grad_dtype`` value).
    wire = None
    #: Whether the hook keeps state for one model (then it serves one optimizer only).
    stateful = True

    def __call__(self, comm, bucket):
        """Leave ``bucket.grads`` averaged over the ranks of ``comm``, in place."""
        raise NotImplementedError('{} must implement __call__(comm, bucket)'.format(type(self).__name__))

    def serialize(self, serializer):
        """Save or load the hook's state with a Chainer serializer (default: the hook has none).

        State under ``serializer[RANK_MEAN]`` is per rank; a job resumed on another number of
        ranks starts every rank from the mean of the old ranks' values.
        """

    def __str__(self):
        return self.name

    def __repr__(self):
        return '<{} {}>'.format(type(self).__name__, self)


class WireHook(CommHook):
    """An exact average whose terms cross the network in ``wire`` (an ``allreduce_grad_dtype``).

    The communicator's own averaging path, as ``create_communicator(...,
    allreduce_grad_dtype=wire)`` averages: the same bits.
    """

    is_wire = True
    stateful = False

    def __init__(self, wire):
        self.wire = _dtypes.validate_grad_dtype(wire)

    @property
    def name(self):
        if self.wire is None:
            return 'exact'
        if isinstance(self.wire, str):
            return self.wire
        return numpy.dtype(self.wire).name

    def __call__(self, comm, bucket):
        mean(comm, bucket.grads, self.wire)


class FunctionHook(CommHook):
    """A plain function ``fn(comm, bucket)`` used as a hook (no state to save)."""

    stateful = False

    def __init__(self, fn):
        if not callable(fn):
            raise TypeError('comm_hook must be a CommHook, a function fn(comm, bucket), an '
                            'allreduce_grad_dtype value or None; got {!r}'.format(fn))
        self.fn = fn
        self.name = getattr(fn, '__name__', type(fn).__name__)

    def __call__(self, comm, bucket):
        self.fn(comm, bucket)


def mean(comm, arrays, wire=None):
    """Average ``arrays`` (NumPy or CuPy) over the ranks of ``comm`` in place, for use inside a hook.

    ``wire`` is what crosses the network: None (the arrays' own dtype, exact), ``numpy.float16``,
    ``'bfloat16'``, ``numpy.float64``, ... or ``'auto'``, as ``allreduce_grad_dtype``.  The same
    path as ``multi_node_mean_grad``; every rank must call it with the same shapes and dtypes.
    """
    averaging = getattr(comm, 'averaging', None)
    if averaging is None:
        raise TypeError('chainermn.hooks.mean needs a chainermn communicator (create_communicator); '
                        'got {}'.format(type(comm).__name__))
    arrays = list(arrays)
    if arrays:
        averaging.mean_arrays(arrays, _dtypes.validate_grad_dtype(wire))
