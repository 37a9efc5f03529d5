"""The gradient engine: comm's named internal API for its sibling packages (train, links).

Not part of the documented ``chainermn`` API and free to change between minor versions, but the
only way chainermn-train and chainermn-links reach comm's internals: they import these names from
here, never from comm's underscore modules (a test walks the sources for that).

- :class:`ChunkedReducer`: all-reduce and broadcast host arrays in pieces through reused buffers.
- :class:`NodeReducer`: average host gradients through node-shared memory, MPI between nodes.
- :class:`Pacer`: polite waiting for a nonblocking collective run from a helper thread.
- :func:`detect_topology`: which ranks share a node.
- :func:`fail_together`: raise the same error on every rank when one rank's input is invalid.
- :func:`guarded_call`: run a blocking call of a sibling package under a communicator's guard
  (agreement check, stall report, watchdog); a no-op for a raw mpi4py communicator.
- :func:`nccl_dtype`: the NCCL data type of a NumPy dtype, or None (imports CuPy).
"""

from chainermn_comm._grad import ChunkedReducer
from chainermn_comm.guard import fail_together, guarded_call
from chainermn_comm._shm_reduce import NodeReducer
from chainermn_comm._stream import Pacer
from chainermn_comm._topology import detect_topology

__all__ = ['ChunkedReducer', 'NodeReducer', 'Pacer', 'detect_topology', 'fail_together',
           'guarded_call', 'nccl_dtype']


def nccl_dtype(dtype):
    """Return the NCCL data type of ``dtype``, or None when NCCL has none (imports CuPy lazily)."""
    from chainermn_comm.gpu._nccl import nccl_dtype as impl
    return impl(dtype)
