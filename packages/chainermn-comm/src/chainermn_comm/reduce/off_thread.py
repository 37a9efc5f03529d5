"""The reducer that averages off the main thread: the plain path's, on a duplicate communicator.

``BackwardOverlap``'s buckets and double buffering average in a thread of their own; they get
their reducer here, the one way (re-exported by ``chainermn_comm.averaging`` and ``engine``):
the same ``NodeReducer`` as the plain path's (so the bits match), on a duplicate of the
communicator (so its messages never meet the main thread's).
"""

from chainermn_comm._topology import detect_topology
from chainermn_comm.reduce import chunked as _grad
from chainermn_comm.reduce.node_shared import NodeReducer

__all__ = ['ThreadReducer', 'thread_reducer']


class ThreadReducer:
    """A reducer of its own on a duplicate of a communicator, for averages run off the main thread.

    ``mpi_comm`` (the duplicate), ``topology`` (which of its ranks share a node) and ``reducer``
    (a ``NodeReducer``: node-shared memory first, as the plain path, so the bits match).
    """

    def __init__(self, mpi_comm, chunk_bytes=None):
        self.mpi_comm = mpi_comm.Dup()
        self.topology = detect_topology(self.mpi_comm)
        self.reducer = NodeReducer(self.mpi_comm, self.topology,
                                   _grad.ChunkedReducer(self.mpi_comm, chunk_bytes=chunk_bytes))

    def free(self):
        """Release the reducer and the duplicate communicator (collective)."""
        reducer, self.reducer = self.reducer, None
        if reducer is not None:
            reducer.free()
            self.mpi_comm.Free()


def thread_reducer(comm, chunk_bytes=None):
    """Return a :class:`ThreadReducer` on ``comm`` (collective): the one way to average off the main thread."""
    return ThreadReducer(comm.mpi_comm, chunk_bytes)
