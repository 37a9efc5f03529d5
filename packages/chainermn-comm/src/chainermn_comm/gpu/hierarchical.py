"""The hierarchical and non_cuda_aware communicators: NCCL within a node, MPI between nodes."""

from chainermn_comm._finalize import free_comm
from chainermn_comm.gpu._base import GpuCommunicatorBase
from chainermn_comm.gpu._layout import rank_position
from chainermn_comm.gpu._nccl import NcclGroup, nccl_dtype, nccl_op

__all__ = ['HierarchicalCommunicator', 'NonCudaAwareCommunicator', 'TwoLevelBase']


class TwoLevelBase(GpuCommunicatorBase):
    """Shared set-up: ``_intra`` (ranks of this node, NCCL) and ``_inter`` (same intra rank, MPI)."""

    def _setup(self):
        topo = self._topology
        self._intra_mpi = self._mpi_comm.Split(topo.node_id, self.rank)
        self._inter = self._mpi_comm.Split(topo.intra_rank, self.rank)
        self._intra = NcclGroup(self._intra_mpi, 'intra-node', self)

    def _release(self):
        self._intra.close()
        free_comm(self._intra_mpi)
        free_comm(self._inter)
        super()._release()

    def _inter_allreduce(self, arr, op, wire=None):
        if self._inter.Get_size() > 1:
            self._mpi_allreduce_dev(self._inter, arr, op, wire)

    def _two_level_allreduce(self, arr, op, what, wire=None):
        """NCCL reduce to intra rank 0, MPI all-reduce among those leaders, NCCL bcast back."""
        self._intra.reduce(arr, arr, 0, op, what=what + ' (intra-node reduce)', dtype=wire)
        if self.intra_rank == 0:
            self._inter_allreduce(arr, op, wire)
        self._intra.bcast(arr, 0, what=what + ' (intra-node bcast)')

    def _sum_buffer(self, buf, layout, wire=None):
        self._two_level_allreduce(buf, 'sum', 'allreduce_grad', wire)

    def _device_allreduce(self, arr, op):
        if nccl_dtype(arr.dtype) is None or nccl_op(op) is None:
            return super()._device_allreduce(arr, op)
        self._two_level_allreduce(arr, op, 'allreduce')
        return True

    def _device_bcast(self, arr, root):
        node, intra = rank_position(self._topology.hosts, root)
        if intra != 0:
            # Root is not its node's leader: one MPI broadcast over all ranks.
            self._mpi_bcast_dev(self._mpi_comm, arr, root)
            return
        if self.intra_rank == 0 and self._inter.Get_size() > 1:
            # Leaders' communicator ranks follow node order, so the root's node id is its rank there.
            self._mpi_bcast_dev(self._inter, arr, node)
        self._intra.bcast(arr, 0, what='bcast (intra-node)')


class HierarchicalCommunicator(TwoLevelBase):
    """NCCL within each node, MPI between node leaders (device buffers when MPI is CUDA-aware)."""

    name = 'hierarchical'


class NonCudaAwareCommunicator(TwoLevelBase):
    """Like hierarchical, but MPI only ever sees host memory (for MPI builds without CUDA support)."""

    name = 'non_cuda_aware'

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.cuda_aware = False
        self.cuda_aware_reason = "communicator 'non_cuda_aware' always stages through host memory"
