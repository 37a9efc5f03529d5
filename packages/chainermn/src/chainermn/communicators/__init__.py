"""Communicators (``chainermn.communicators``), from chainermn-comm.

``create_communicator`` builds one by name; every communicator implements ``CommunicatorBase``.
"""

from chainermn_comm import (COMMUNICATOR_NAMES, CommunicationError, CommunicatorBase,
                            CommunicatorUnavailableError, CPUModeWarning, MpiCommunicatorBase,
                            NaiveCommunicator, create_communicator)

__all__ = ['COMMUNICATOR_NAMES', 'CommunicationError', 'CommunicatorBase',
           'CommunicatorUnavailableError', 'CPUModeWarning', 'MpiCommunicatorBase',
           'NaiveCommunicator', 'create_communicator']
