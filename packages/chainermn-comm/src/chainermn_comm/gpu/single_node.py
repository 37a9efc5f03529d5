"""The single_node communicator: NCCL among the GPUs of one node."""

from chainermn_comm.gpu.pure_nccl import PureNcclCommunicator

__all__ = ['SingleNodeCommunicator']


class SingleNodeCommunicator(PureNcclCommunicator):
    """NCCL over all ranks, which must all run on one node."""

    name = 'single_node'

    def _setup(self):
        if self.inter_size > 1:
            raise ValueError(
                "rank {}: communicator 'single_node' needs every rank on one node, but the {} ranks "
                "span {} nodes ({}); use 'pure_nccl' or 'hierarchical' for multi-node runs".format(
                    self.rank, self.size, self.inter_size, ', '.join(sorted(set(self._topology.hosts)))))
        super()._setup()
