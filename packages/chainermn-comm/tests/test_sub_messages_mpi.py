"""A communicator's own errors on a split communicator name the world rank, its own rank beside it (issue 55)."""

import os

import pytest

from chainermn_comm.testing import run_pytest_under_mpi

HERE = os.path.dirname(__file__)


@pytest.mark.parametrize('n', [1, 3])
def test_sub_communicator_messages(n):
    run_pytest_under_mpi(os.path.join(HERE, 'mpi', 'mpi_sub_messages.py'), n, timeout=120)
