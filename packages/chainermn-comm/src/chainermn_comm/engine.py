"""The gradient engine: comm's named internal API for its sibling packages (train, links).

Not part of the documented ``chainermn`` API and free to change between minor versions, but the
only way chainermn-train and chainermn-links reach comm's internals: they import these names from
here, never from comm's underscore modules (a test walks the sources for that).

- :class:`Averaging`, :class:`ModelAverage`, :func:`averaging_of`: the averaging interface
  (``chainermn_comm.averaging``): the one way a model's gradients, or a bucket of them, are
  averaged; a communicator's ``guard`` and ``averaging`` properties (None on a user's own
  communicator) are how siblings reach its checked call and its averages.
- :class:`ChunkedReducer`: all-reduce and broadcast host arrays in pieces through reused buffers.
- :class:`NodeReducer`: average host gradients through node-shared memory, MPI between nodes.
- :class:`ShardCollectives`: reduce-scatter arrays to their owner ranks and all-gather them back
  (sharded optimizer state; ``comm.averaging.shard_collectives()`` is a communicator's own, and
  the overlap makes one over its duplicated communicator).
- :class:`Pacer`: polite waiting for a nonblocking collective run from a helper thread.
- :func:`detect_topology`: which ranks share a node.
- :func:`fail_together`: raise the same error on every rank when one rank's input is invalid.
- :func:`guarded_call`: run a blocking call of a sibling package under a communicator's guard
  (agreement check, stall report, watchdog); a no-op for a raw mpi4py communicator.
- :func:`nccl_dtype`: the NCCL data type of a NumPy dtype, or None (imports CuPy).
- :func:`mark_next_collective`, :func:`collective_marks`: let one int per rank ride on the
  agreement check of a communicator's next collective call (no message of its own), and read
  every rank's; :func:`rank_hosts`: every rank's host, when the communicator knows them.
- :class:`CallTuning` (the one tuning driver: ``begin``/``end`` around each call), :func:`first`
  (an axis's values, the current one first), :class:`Tuner`, :func:`reducer_axes`,
  :func:`apply_reducer_config`, :func:`knobs_tunable`, :func:`is_auto`, :data:`WIRE_AUTO`: tune an average on the job's own calls, the same on every
  rank (``reduce.tune``); :func:`grad_dtype`: a communicator's wire now, ``'auto'`` resolved.
"""

from chainermn_comm.averaging import Averaging, ModelAverage, ThreadReducer, averaging_of, thread_reducer
from chainermn_comm.reduce.chunked import ChunkedReducer
from chainermn_comm.guard import fail_together, guarded_call
from chainermn_comm.reduce.node_shared import NodeReducer
from chainermn_comm.reduce.shard import ShardCollectives
from chainermn_comm.reduce.stream import Pacer
from chainermn_comm._topology import detect_topology
from chainermn_comm.reduce.tune import AUTO as WIRE_AUTO
from chainermn_comm.reduce.tune import (CallTuning, Tuner, apply_reducer_config, first, is_auto, knobs_tunable,
                                        reducer_axes)

__all__ = ['Averaging', 'ModelAverage', 'ThreadReducer', 'thread_reducer', 'averaging_of', 'ChunkedReducer',
           'NodeReducer', 'ShardCollectives', 'Pacer',
           'detect_topology', 'fail_together', 'guarded_call', 'nccl_dtype', 'Tuner', 'reducer_axes', 'apply_reducer_config',
           'knobs_tunable', 'is_auto', 'CallTuning', 'first', 'WIRE_AUTO', 'grad_dtype',
           'mark_next_collective', 'collective_marks', 'rank_hosts']


def grad_dtype(communicator):
    """Return the wire of ``communicator``'s gradient average now (None: the gradients' dtype).

    Its ``allreduce_grad_dtype``, with ``'auto'`` resolved to the plain path's current choice
    (None until ``multi_node_mean_grad`` has tuned it).
    """
    averaging = averaging_of(communicator)
    if averaging is not None:
        return averaging.wire_now()
    wanted = getattr(communicator, 'allreduce_grad_dtype', None)
    return None if is_auto(wanted) else wanted


def nccl_dtype(dtype):
    """Return the NCCL data type of ``dtype``, or None when NCCL has none (imports CuPy lazily)."""
    from chainermn_comm.gpu._nccl import nccl_dtype as impl
    return impl(dtype)


def mark_next_collective(communicator, word):
    """Let ``word`` (an int) ride on ``communicator``'s next collective call; return whether it can.

    It rides in the agreement check's all-gathered record (communicators of at most 64 ranks
    with the default check): no message of its own.  Where it returns False (other
    communicators, ``CHAINERMN_CHECK=0``, ``CHAINERMN_DEBUG=1``, one rank) the caller exchanges
    the word itself; that answer is the same on every rank.
    """
    mark = getattr(getattr(communicator, 'guard', None), 'mark', None)
    return bool(mark(word)) if mark is not None else False


def collective_marks(communicator):
    """Return every rank's word (a list in rank order) from the last collective that carried marks."""
    return getattr(getattr(communicator, 'guard', None), 'marks', None)


def rank_hosts(communicator):
    """Return every rank's host name (a list in rank order), or None when the communicator does not know them."""
    hosts = getattr(getattr(communicator, 'guard', None), 'hosts', None)
    return list(hosts) if hosts is not None else None
