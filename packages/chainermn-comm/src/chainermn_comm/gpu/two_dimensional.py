"""The two_dimensional communicator: NCCL reduce-scatter in a node, MPI between nodes, NCCL allgather."""

from chainermn_comm.gpu.hierarchical import TwoLevelBase

__all__ = ['TwoDimensionalCommunicator']


class TwoDimensionalCommunicator(TwoLevelBase):
    """Each rank of a node all-reduces one shard across nodes, so every NIC of a node is busy."""

    name = 'two_dimensional'

    def _setup(self):
        sizes = self._mpi_comm.allgather(self.intra_size)
        if len(set(sizes)) != 1:
            raise ValueError(
                "rank {}: communicator 'two_dimensional' needs the same number of ranks on every node; "
                "got ranks per node {} (use 'hierarchical' instead)".format(
                    self.rank, sorted(set(sizes))))
        super()._setup()

    def _grad_align(self):
        return self.intra_size

    def _sum_buffer(self, buf, layout, wire=None):
        n = self.intra_size
        if n == 1:
            self._inter_allreduce(buf, 'sum', wire)
            return
        shard_len = buf.size // n
        shard = self._packer.buffer(wire or buf.dtype, shard_len, 'shard')
        self._intra.reduce_scatter(buf, shard, 'sum', what='allreduce_grad (intra-node reduce_scatter)',
                                   dtype=wire)
        self._inter_allreduce(shard, 'sum', wire)
        self._intra.allgather(shard, buf, what='allreduce_grad (intra-node allgather)')
