"""Drive the finite check's per-rank tests (mpi/mpi_finite.py) under mpiexec."""

import os

import pytest

from chainermn_comm.testing import run_pytest_under_mpi

HERE = os.path.dirname(__file__)


@pytest.mark.parametrize('n', [1, 2, 3])
def test_finite_check(n):
    run_pytest_under_mpi(os.path.join(HERE, 'mpi', 'mpi_finite.py'), n, timeout=240)
