"""Communicators (``chainermn.communicators``), from chainermn-comm.

``create_communicator`` builds one by name; every communicator implements ``CommunicatorBase``.
v7's submodules (``communicator_base``, ``mpi_communicator_base``, ``naive_communicator``,
``flat_communicator``, ``non_cuda_aware_communicator``, ``pure_nccl_communicator``,
``dummy_communicator``) hold the same classes; they are imported on first use (``import
chainermn`` stays light).
"""

import importlib

from chainermn_comm import (COMMUNICATOR_NAMES, CommunicationError, CommunicatorBase,
                            CommunicatorUnavailableError, CPUModeWarning, MpiCommunicatorBase,
                            NaiveCommunicator, create_communicator)

__all__ = ['COMMUNICATOR_NAMES', 'CommunicationError', 'CommunicatorBase',
           'CommunicatorUnavailableError', 'CPUModeWarning', 'MpiCommunicatorBase',
           'NaiveCommunicator', 'create_communicator']

#: v7's submodules of ``chainermn.communicators``.
_SUBMODULES = ('communicator_base', 'mpi_communicator_base', 'naive_communicator', 'flat_communicator',
              'non_cuda_aware_communicator', 'pure_nccl_communicator', 'dummy_communicator')


def __getattr__(name):
    """Import one of v7's submodules the first time it is used as an attribute."""
    if name in _SUBMODULES:
        return importlib.import_module(__name__ + '.' + name)
    raise AttributeError('module {!r} has no attribute {!r}'.format(__name__, name))
