"""chainermn-comm: ChainerMN communicators over MPI (CPU) and CuPy/NCCL (GPU)."""

from chainermn_comm import global_except_hook, process
from chainermn_comm._errors import CommunicationError, CommunicatorUnavailableError
from chainermn_comm._factory import COMMUNICATOR_NAMES, CPUModeWarning, create_communicator
from chainermn_comm._finalize import CommunicatorFinalizedError
from chainermn_comm._mpi_base import MpiCommunicatorBase
from chainermn_comm._version import __version__
from chainermn_comm.communicator_base import CommunicatorBase
from chainermn_comm.naive import NaiveCommunicator

__all__ = ['create_communicator', 'CommunicatorBase', 'MpiCommunicatorBase', 'NaiveCommunicator',
           'CommunicationError', 'CommunicatorFinalizedError', 'CommunicatorUnavailableError',
           'CPUModeWarning', 'COMMUNICATOR_NAMES', 'global_except_hook', '__version__']

# No import above initialises MPI (mpi4py.MPI is imported lazily), so this still runs before
# MPI_Init: under srun --mpi=pmi2 with the mpich wheel it selects the OFI netmod (docs/cluster.md,
# "Slurm"); and CHAINERMN_FORCE_ABORT_ON_EXCEPTION=1 installs the abort hook (docs/process.md).
process.on_import()
