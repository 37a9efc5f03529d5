"""Run backward and average the gradients of a link across ranks, as one step.

Chainer 7.8.1 keeps the gradients of leaf variables (parameters) in an internal table
during ``backward`` and writes them to ``param.grad`` only when the whole backward pass
has finished (checked with a FunctionHook: every ``param.grad`` is still None in
``backward_postprocess`` of its last consumer).  Function hooks therefore tell *when* a
gradient is final but not *what* it is, so the all-reduce cannot start before backward
returns without reaching into Chainer's internals.  On the CPU this costs nothing (two
ranks on two cores have no idle core to hide communication behind); the reduction then
runs through the same path as ``multi_node_mean_grad`` (node-shared memory or MPI) on a
communicator this object owns, so it is never slower and gives identical results.
"""

import numpy

from chainermn_comm import _grad
from chainermn_comm import _shm_reduce
from chainermn_comm import _topology

__all__ = ['BackwardOverlap']


class BackwardOverlap:
    """Run ``loss.backward`` and leave every gradient of ``link`` averaged over all ranks.

    The result equals ``communicator.multi_node_mean_grad(link, zero_fill=True)`` after a
    plain ``loss.backward()``: parameters without a gradient get zeros, gradients are
    reduced in ``communicator.allreduce_grad_dtype`` (when set) and averaged.
    Creating the object is collective (it duplicates the MPI communicator).
    """

    def __init__(self, communicator, link, chunk_bytes=None):
        self.communicator = communicator
        self.link = link
        self._mpi_comm = communicator.mpi_comm.Dup()
        self._reducer = _shm_reduce.NodeReducer(
            self._mpi_comm, _topology.detect_topology(self._mpi_comm),
            _grad.ChunkedReducer(self._mpi_comm, chunk_bytes=chunk_bytes))

    def run_backward(self, loss, **backward_kwargs):
        """Run ``loss.backward(**backward_kwargs)`` and average the gradients across ranks."""
        loss.backward(**backward_kwargs)
        params = _grad.collect_params(self.link, zero_fill=True)
        if not all(isinstance(p.grad, numpy.ndarray) for p in params):
            # Device arrays: the communicator's own device path does the work.
            self.communicator.multi_node_mean_grad(self.link, zero_fill=True)
            return
        grads = []
        for p in params:
            if not p.grad.flags.c_contiguous:
                p.grad = numpy.ascontiguousarray(p.grad)
            grads.append(p.grad)
        dtype = getattr(self.communicator, 'allreduce_grad_dtype', None)
        guard = getattr(self.communicator, '_guard', None)
        if guard is None:
            self._reducer.mean(grads, dtype=dtype)
            return
        sig = (('params', tuple((g.shape, g.dtype.str) for g in grads)),)
        with guard('multi_node_mean_grad(overlap)', sig):
            self._reducer.mean(grads, dtype=dtype)

    def free(self):
        """Release the duplicated MPI communicator and its shared memory (collective)."""
        if self._mpi_comm is not None:
            self._reducer.free()
            self._mpi_comm.Free()
            self._mpi_comm = None
