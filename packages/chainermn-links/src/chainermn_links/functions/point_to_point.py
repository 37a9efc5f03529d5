"""Differentiable point-to-point communication: ``send``, ``recv`` and their delegate variables.

Protocol (one message per direction per call, all on the user's ``tag``):

* forward, ``send`` -> ``recv``: ``(meta, *arrays)`` with ``meta = [FORWARD, seq, on_gpu, is_tuple]``;
* backward, ``recv`` -> ``send``: ``(meta, *grads)`` with ``meta = [GRADIENT, seq, 0, 0]``.

``seq`` numbers every ``send`` per (communicator, destination, tag).  The backward of ``send``
waits for the gradient with its own ``seq`` and parks gradients of other sends that arrive
first, so the order in which the receiver runs its backward does not matter.  A message of the
wrong kind (gradient where data was expected, raw ``comm.send`` data, objects) raises
``CommunicationError`` on the spot instead of silently mixing up tensors.
"""

import itertools
import weakref

import chainer
import numpy
from chainer import function_node

from chainermn_comm import CommunicationError

from chainermn_links.functions import _util

__all__ = ['send', 'recv', 'Send', 'Recv']

FORWARD = 0x6d6e01
GRADIENT = 0x6d6e02

_state = weakref.WeakKeyDictionary()
#: The same for communicators that cannot be weakly referenced, by id (each kept alive with its state).
_held = {}


class _PeerState:
    """Per-communicator counters for ``send`` and parked gradient messages."""

    def __init__(self):
        self.counters = {}
        self.parked = {}

    def next_seq(self, dest, tag):
        counter = self.counters.setdefault((dest, tag), itertools.count())
        return next(counter)


def _peer_state(comm):
    try:
        st = _state.get(comm)
        if st is None:
            st = _state[comm] = _PeerState()
        return st
    except TypeError:  # communicator not weak-referenceable: keep it (and the communicator) here
        held = _held.get(id(comm))
        if held is None or held[0] is not comm:
            held = _held[id(comm)] = (comm, _PeerState())
        return held[1]


def _meta(kind, seq, on_gpu=False, is_tuple=False):
    return numpy.array([kind, seq, int(on_gpu), int(is_tuple)], dtype=numpy.int64)


def _split_message(comm, msg, peer, tag, expected, waiting_for):
    """Validate a received message; return (meta, arrays)."""
    rank = comm.rank
    if (not isinstance(msg, tuple) or not msg or not isinstance(msg[0], numpy.ndarray)
            or msg[0].dtype != numpy.int64 or msg[0].shape != (4,)
            or int(msg[0][0]) not in (FORWARD, GRADIENT)):
        raise CommunicationError(
            'rank {}: {} from rank {} (tag {}) got a message that chainermn_links.functions.send did '
            'not produce (plain comm.send data?). Pair functions.send with functions.recv, and '
            'comm.send with comm.recv.'.format(rank, waiting_for, peer, tag))
    meta = msg[0]
    kind = int(meta[0])
    if kind != expected:
        if expected == FORWARD:
            detail = ('a gradient sent back by the backward of functions.recv. The ranks are out of '
                      'step: rank {} ran backward through a recv whose send on this rank was never '
                      'back-propagated (connect the delegate variable returned by send, e.g. with '
                      'pseudo_connect, or call backward on it)'.format(peer))
        else:
            detail = ('forward data from functions.send. The ranks are out of step: a functions.recv '
                      'on rank {} was not reached by backward (its output does not influence the loss; '
                      'use pseudo_connect or the delegate_variable argument to connect it)'.format(peer))
        raise CommunicationError('rank {}: {} from rank {} (tag {}) expected {} but received {}'.format(
            rank, waiting_for, peer, tag,
            'forward data' if expected == FORWARD else 'a gradient', detail))
    return meta, msg[1:]


class Send(function_node.FunctionNode):
    """Send the inputs to ``peer``; output a delegate variable; backward receives their gradients."""

    def __init__(self, comm, peer, tag):
        self.comm = comm
        self.peer = peer
        self.tag = tag
        self.seq = None

    def forward(self, inputs):
        xs = inputs[1:]
        xp = chainer.backend.get_array_module(*xs)
        self._in_specs = [_util.spec(x) for x in xs]
        st = _peer_state(self.comm)
        self.seq = st.next_seq(self.peer, self.tag)
        on_gpu = xp is not numpy
        is_tuple = getattr(self, '_is_tuple', len(xs) != 1)
        self.comm.send((_meta(FORWARD, self.seq, on_gpu, is_tuple),) + tuple(xs), self.peer, self.tag)
        return _util.delegate_array(xp, xs[0].dtype),

    def backward(self, target_input_indexes, grad_outputs):
        st = _peer_state(self.comm)
        key = (self.peer, self.tag, self.seq)
        grads = st.parked.pop(key, None)
        while grads is None:
            msg = self.comm.recv(self.peer, self.tag)
            meta, arrays = _split_message(self.comm, msg, self.peer, self.tag, GRADIENT,
                                          'backward of functions.send')
            seq = int(meta[1])
            if seq == self.seq:
                grads = arrays
            else:
                st.parked[(self.peer, self.tag, seq)] = arrays
        if len(grads) != len(self._in_specs):
            raise CommunicationError(
                'rank {}: backward of functions.send to rank {} (tag {}) sent {} arrays but got {} '
                'gradients back'.format(self.comm.rank, self.peer, self.tag, len(self._in_specs), len(grads)))
        gxs = [None]
        for g, (shape, dtype, xp) in zip(grads, self._in_specs):
            if g.shape != shape:
                raise CommunicationError(
                    'rank {}: backward of functions.send to rank {} (tag {}) got a gradient of shape {} '
                    'for an input of shape {}'.format(self.comm.rank, self.peer, self.tag, g.shape, shape))
            g = _util.to_device_of(g, xp)
            if g.dtype != dtype:
                g = g.astype(dtype)
            gxs.append(chainer.Variable(g))
        return tuple(gxs)


class Recv(function_node.FunctionNode):
    """Receive arrays from ``peer``; backward sends their gradients back to it."""

    def __init__(self, comm, peer, tag):
        self.comm = comm
        self.peer = peer
        self.tag = tag

    def forward(self, inputs):
        self._delegate_specs = [_util.spec(d) for d in inputs]
        msg = self.comm.recv(self.peer, self.tag)
        meta, arrays = _split_message(self.comm, msg, self.peer, self.tag, FORWARD, 'functions.recv')
        self.seq = int(meta[1])
        self.is_tuple = bool(meta[3])
        if bool(meta[2]):
            cupy = _util.cupy_if_available()
            if cupy is not None:
                arrays = tuple(cupy.asarray(a) for a in arrays)
        self._out_specs = [_util.spec(a) for a in arrays]
        return tuple(arrays)

    def backward(self, target_input_indexes, grad_outputs):
        grads = []
        for g, s in zip(grad_outputs, self._out_specs):
            grads.append(_util.zeros_like_spec(s) if g is None else g.array)
        self.comm.send((_meta(GRADIENT, self.seq),) + tuple(grads), self.peer, self.tag)
        return tuple(chainer.Variable(_util.zeros_like_spec(s)) for s in self._delegate_specs)


def send(x, communicator, rank, tag=0):
    """Send ``x`` (a Variable or a tuple of Variables) to process ``rank``; return a delegate variable.

    The delegate variable holds no data (a 0-dim zero).  Calling ``backward()`` on it (or on any
    variable that depends on it, see :func:`pseudo_connect`) receives the gradients of ``x`` from
    ``rank`` and back-propagates them.  ``x`` need not require a gradient: the send still takes
    part in backward so that the receiver's gradient message is consumed.
    """
    _check_peer(communicator, rank, 'send')
    is_tuple = isinstance(x, (tuple, list))
    xs = _util.as_variable_tuple(x, 'chainermn_links.functions.send')
    if not xs:
        raise ValueError('rank {}: functions.send needs at least one variable'.format(communicator.rank))
    node = Send(communicator, int(rank), tag)
    node._is_tuple = is_tuple
    delegate, = node.apply((_util.dummy_variable(),) + xs)
    return delegate


def recv(communicator, rank, delegate_variable=None, tag=0, force_tuple=False):
    """Receive what process ``rank`` sent with :func:`send`; backward sends the gradients back.

    ``delegate_variable`` (the output of an earlier ``send`` or any variable of the previous
    graph component on this process) makes the received variables depend on it, so backward
    reaches that component after this one.  Returns a Variable, or a tuple when a tuple was sent
    or ``force_tuple`` is True.
    """
    _check_peer(communicator, rank, 'recv')
    if delegate_variable is None:
        delegates = (_util.dummy_variable(),)
    else:
        delegates = _util.as_variable_tuple(delegate_variable, 'chainermn_links.functions.recv')
        if not any(d.requires_grad for d in delegates):
            delegates = delegates + (_util.dummy_variable(),)
    node = Recv(communicator, int(rank), tag)
    ys = node.apply(delegates)
    if force_tuple or node.is_tuple:
        return tuple(ys)
    return ys[0]


def _check_peer(comm, rank, what):
    if isinstance(rank, bool) or not isinstance(rank, (int, numpy.integer)):
        raise TypeError('rank {}: functions.{} needs an int rank; got {!r}'.format(comm.rank, what, rank))
    if not 0 <= int(rank) < comm.size:
        raise ValueError('rank {}: functions.{} rank={} is out of range 0..{}'.format(
            comm.rank, what, rank, comm.size - 1))
    if int(rank) == comm.rank:
        raise ValueError('rank {}: functions.{} to/from itself would deadlock; pass another rank'.format(
            comm.rank, what))
