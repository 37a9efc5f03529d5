"""Run the identical-first-batches tests (tests/mpi/mpi_same_batches.py) at 1, 2 and 3 ranks."""

import os

import pytest

from chainermn_comm.testing import run_pytest_under_mpi

HERE = os.path.dirname(__file__)


@pytest.mark.parametrize('n', [1, 2, 3])
def test_same_batches(n):
    run_pytest_under_mpi(os.path.join(HERE, 'mpi', 'mpi_same_batches.py'), n, timeout=180)
