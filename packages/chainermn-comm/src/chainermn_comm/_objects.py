"""Python objects of the ``*_obj`` calls: pickled before the call, so that a failure is everyone's.

A rank pickles its object (mpi4py's protocol-5 pickle, large buffers out of band) *before* the
collective's agreement check.  An object that cannot be pickled, or is too big to pickle in this
process's memory, becomes that rank's invalid input: every rank of the call raises
:class:`~chainermn_comm.CommunicationError` naming the rank, its host and the object's type
instead of the others waiting for the watchdog.  A large object travels as a :class:`Pickled`,
whose own pickle refers to the bytes already made (``pickle.PickleBuffer``, sent out of band by
``mpi4py.util.pkl5``): it is not pickled or copied twice.  A small one (at most
``SMALL_BYTES`` pickled, no out-of-band buffer) travels as itself: pickling it again costs less
than the wrapper, and the receiver's ``MPI.Status`` counts its own pickle's bytes.
"""

import pickle

from chainermn_comm._errors import CommunicationError

__all__ = ['ObjectCalls', 'Pickled', 'prepickle', 'SendFailed', 'type_name', 'SMALL_BYTES']

#: Largest pickle that travels as the object itself (pickled again by pkl5).
SMALL_BYTES = 64 * 1024

#: What objects that cannot be pickled usually are.
_HINT = ('Pass only objects that pickle can serialise (not lambdas or functions defined inside '
         'functions, open files, locks, sockets, generators or objects holding them).')


def _pickle():
    from mpi4py import MPI
    return MPI.pickle


def _load(data, bufs):
    """Unpickle what :class:`Pickled` carried (called by the receiver's unpickler)."""
    return _pickle().loads_oob(data, bufs)


class Pickled:
    """An object already pickled by :func:`prepickle`; unpickles to the object itself."""

    __slots__ = ('data', 'bufs')

    def __init__(self, data, bufs):
        self.data = data
        self.bufs = bufs

    def __reduce_ex__(self, protocol):
        return (_load, (pickle.PickleBuffer(self.data), [pickle.PickleBuffer(b) for b in self.bufs]))


class SendFailed:
    """What ``send_obj`` sends instead of an object it could not pickle: the receiver raises too."""

    __slots__ = ('message',)

    def __init__(self, message):
        self.message = message

    def __reduce__(self):
        return (SendFailed, (self.message,))


def type_name(obj):
    """Return the qualified name of ``obj``'s type, e.g. 'builtins.function' or 'mymod.Model'."""
    t = type(obj)
    module = getattr(t, '__module__', '?')
    return '{}.{}'.format(module, getattr(t, '__qualname__', t.__name__))


def prepickle(obj, call, rank, host):
    """Return ``(what to send, None)``, or ``(None, CommunicationError)`` naming rank, host and type."""
    try:
        data, bufs = _pickle().dumps_oob(obj)
    except Exception as e:  # PicklingError, TypeError, AttributeError, RecursionError, MemoryError
        detail = str(e).strip().splitlines()
        detail = detail[0] if detail else ''
        if len(detail) > 200:
            detail = detail[:197] + '...'
        return None, CommunicationError(
            "rank {} (host {}): {} cannot pickle its object of type '{}' ({}: {}). {} Every rank of "
            'the call raises this error.'.format(rank, host, call, type_name(obj), type(e).__name__,
                                                 detail, _HINT))
    if not bufs and len(data) <= SMALL_BYTES:
        return obj, None
    return Pickled(data, bufs), None


class ObjectCalls:
    """``send_obj``, ``bcast_obj``, ``gather_obj`` and ``allgather_obj`` for :class:`MpiCommunicatorBase`.

    Uses the communicator's ``_guard``, ``_pkl`` (an ``mpi4py.util.pkl5`` communicator),
    ``_rank``, ``_check_rank``, ``_check_tag``, ``_root_arg`` and ``_rooted``.
    """

    def _prepickle(self, obj, call):
        """Return (the object pickled, None) or (None, the error every rank of ``call`` raises)."""
        return prepickle(obj, call, self._rank, getattr(self._guard, 'host', '?'))

    def send_obj(self, obj, dest, tag):
        dest = self._check_rank(dest, 'dest')
        tag = self._check_tag(tag)
        pickled, problem = self._prepickle(obj, 'send_obj(dest={}, tag={})'.format(dest, tag))
        with self._guard('send_obj', (), collective=False, dest=dest, tag=tag):
            # An object that cannot be pickled: the receiver gets the error instead and raises it too.
            self._pkl.send(pickled if problem is None else SendFailed(str(problem)),
                           dest=dest, tag=tag)
        if problem is not None:
            raise problem

    # -- collectives on objects ---------------------------------------------
    # Each rank that sends pickles its object before the agreement check: one that cannot
    # joins the check as invalid input and every rank raises the same CommunicationError.
    # ``max_buf_len`` of ``bcast_obj`` is accepted and ignored: pkl5 moves objects of any size.
    def bcast_obj(self, obj, max_buf_len=None, root=0):
        pickled = problem = None
        root_int, bad = self._root_arg(root)
        if bad is None and self._rank == root_int:
            pickled, problem = self._prepickle(obj, 'bcast_obj(root={})'.format(root_int))
        root, call = self._rooted('bcast_obj', root, problem)
        with call:
            return self._pkl.bcast(pickled, root=root)

    def gather_obj(self, obj, root=0):
        pickled, problem = self._prepickle(obj, 'gather_obj(root={!r})'.format(root))
        root, call = self._rooted('gather_obj', root, problem)
        with call:
            return self._pkl.gather(pickled, root=root)

    def allgather_obj(self, obj):
        """Gather a picklable object of every process on every process (a list)."""
        pickled, problem = self._prepickle(obj, 'allgather_obj()')
        with self._guard('allgather_obj', (), problem=problem):
            return self._pkl.allgather(pickled)
