"""One voice at 1, 2 and 3 ranks: warnings once (rank 0), errors every rank raised together marked."""

import os

import pytest

from chainermn_comm.testing import run_pytest_under_mpi

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.mark.parametrize('n', [1, 2, 3])
def test_voice(n):
    run_pytest_under_mpi(os.path.join(HERE, 'mpi', 'mpi_voice.py'), n, timeout=240)
