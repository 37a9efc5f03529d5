"""GPU communicators (CuPy + NCCL); imported only when a GPU communicator is requested."""

__all__ = ['create_gpu_communicator']


def create_gpu_communicator(name, **kwargs):
    """Build the GPU communicator called ``name``."""
    from chainermn_comm._errors import CommunicatorUnavailableError
    raise CommunicatorUnavailableError(
        "communicator '{}' is not implemented yet in this build".format(name))
