"""GPU communicators (CuPy + NCCL); imported only when a GPU communicator is requested."""

import importlib

__all__ = ['create_gpu_communicator', 'GPU_COMMUNICATORS']

#: name -> (module, class) of every GPU communicator.
GPU_COMMUNICATORS = {
    'flat': ('chainermn_comm.gpu.flat', 'FlatCommunicator'),
    'pure_nccl': ('chainermn_comm.gpu.pure_nccl', 'PureNcclCommunicator'),
    'single_node': ('chainermn_comm.gpu.single_node', 'SingleNodeCommunicator'),
    'hierarchical': ('chainermn_comm.gpu.hierarchical', 'HierarchicalCommunicator'),
    'non_cuda_aware': ('chainermn_comm.gpu.hierarchical', 'NonCudaAwareCommunicator'),
    'two_dimensional': ('chainermn_comm.gpu.two_dimensional', 'TwoDimensionalCommunicator'),
}


def create_gpu_communicator(name, **kwargs):
    """Build the GPU communicator called ``name`` (keyword arguments as create_communicator's)."""
    try:
        module, cls = GPU_COMMUNICATORS[name]
    except KeyError:
        raise ValueError('unknown GPU communicator {!r}; valid names are: {}'.format(
            name, ', '.join(sorted(GPU_COMMUNICATORS))))
    return getattr(importlib.import_module(module), cls)(**kwargs)
