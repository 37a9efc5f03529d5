"""Run the ordinary-mistake tests (tests/mpi/mpi_mistakes.py) at 1, 2 and 3 ranks."""

import os

import pytest

from chainermn_comm.testing import run_pytest_under_mpi

HERE = os.path.dirname(__file__)


@pytest.mark.parametrize('n', [1, 2, 3])
def test_mistakes(n):
    run_pytest_under_mpi(os.path.join(HERE, 'mpi', 'mpi_mistakes.py'), n, timeout=240)
