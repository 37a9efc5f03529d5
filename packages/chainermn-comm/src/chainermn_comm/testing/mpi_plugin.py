"""pytest plugin for tests running on every rank: abort the whole job on the first failure.

A failing assertion on one rank would otherwise leave the other ranks blocked in the
next collective; aborting turns that into an immediate failure with the traceback.
"""

import sys

__all__ = ['pytest_runtest_logreport', 'pytest_sessionfinish']


def _rank():
    from mpi4py import MPI
    return MPI.COMM_WORLD.Get_rank()


def pytest_runtest_logreport(report):
    """Print the failure with its rank and abort every rank."""
    if report.failed:
        from mpi4py import MPI
        sys.stderr.write('\n=== rank {}: {} FAILED in {} ===\n{}\n'.format(
            _rank(), report.nodeid, report.when, report.longreprtext))
        sys.stderr.flush()
        MPI.COMM_WORLD.Abort(1)


def pytest_sessionfinish(session, exitstatus):
    """Mark a clean finish of this rank so the launcher can count passing ranks."""
    if exitstatus == 0:
        from mpi4py import MPI
        MPI.COMM_WORLD.Barrier()
        sys.stdout.write('\nCHAINERMN-RANK-PASSED rank={}\n'.format(_rank()))
        sys.stdout.flush()
