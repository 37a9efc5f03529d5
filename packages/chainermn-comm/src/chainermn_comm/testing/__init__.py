"""Launch code under mpiexec from tests, with a hard timeout that kills every rank."""

from chainermn_comm.testing.launcher import MpiResult, find_mpiexec, run_mpi, run_pytest_under_mpi
from chainermn_comm.testing.shared_dir import shared_tmpdir

__all__ = ['MpiResult', 'find_mpiexec', 'run_mpi', 'run_pytest_under_mpi', 'shared_tmpdir']
