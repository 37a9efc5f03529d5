"""The dummy communicator (Chainer v7's ``dummy``): gradients are not averaged, for measuring."""

from chainermn_comm._mpi_base import MpiCommunicatorBase

__all__ = ['DummyCommunicator']


class DummyCommunicator(MpiCommunicatorBase):
    """Communicator whose gradient averaging communicates nothing (each rank keeps its own gradients).

    For measuring what a training step costs apart from the gradients' communication, as v7's
    ``DummyCommunicator``; every other method communicates as ``naive`` does. Training with it
    is not data-parallel training: never use it for results.
    """

    name = 'dummy'

    def allreduce_grad(self, model, zero_fill=True):
        """Leave every gradient as it is (``zero_fill``: a missing one becomes zeros); no communication."""
        if not zero_fill:
            return
        for param in model.params():
            if param.grad is None and param.array is not None:
                param.grad = param.xp.zeros_like(param.array)

    def multi_node_mean_grad(self, model, zero_fill=True):
        """Leave every gradient as it is, as :meth:`allreduce_grad`."""
        self.allreduce_grad(model, zero_fill=zero_fill)
