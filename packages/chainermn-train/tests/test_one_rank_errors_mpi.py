"""An error only one rank meets is raised on that rank, never answered with a lone collective."""

import os

import pytest

from chainermn_comm.testing import run_pytest_under_mpi

HERE = os.path.dirname(__file__)


@pytest.mark.parametrize('n', [1, 2, 3])
def test_one_rank_errors(n):
    run_pytest_under_mpi(os.path.join(HERE, 'mpi', 'mpi_one_rank_errors.py'), n, timeout=240)
