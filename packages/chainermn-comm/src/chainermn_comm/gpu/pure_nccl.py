"""The pure_nccl communicator: NCCL over all ranks for gradients, bcast and allreduce."""

from chainermn_comm.gpu._base import GpuCommunicatorBase
from chainermn_comm.gpu._nccl import NcclGroup, nccl_dtype, nccl_op

__all__ = ['PureNcclCommunicator']


class PureNcclCommunicator(GpuCommunicatorBase):
    """NCCL everywhere (one rank per GPU); objects and point-to-point go over MPI."""

    name = 'pure_nccl'

    def _setup(self):
        self._nccl = NcclGroup(self._mpi_comm, 'world', self)

    def _release(self):
        self._nccl.close()
        super()._release()

    def _sum_buffer(self, buf, layout, wire=None):
        self._nccl.allreduce(buf, buf, 'sum', what='allreduce_grad', dtype=wire)

    def _device_bcast(self, arr, root):
        self._nccl.bcast(arr, root, what='bcast')

    def _device_allreduce(self, arr, op):
        if nccl_dtype(arr.dtype) is None or nccl_op(op) is None:
            return super()._device_allreduce(arr, op)
        self._nccl.allreduce(arr, arr, op, what='allreduce')
        return True
