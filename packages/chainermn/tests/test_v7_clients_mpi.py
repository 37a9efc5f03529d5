"""Code written for Chainer v7's chainermn runs unchanged, at 1 and 2 ranks (issue 51)."""

import os

import pytest

from chainermn_comm.testing import run_pytest_under_mpi

HERE = os.path.dirname(__file__)


@pytest.mark.parametrize('n', [1, 2])
def test_v7_clients(n):
    run_pytest_under_mpi(os.path.join(HERE, 'mpi', 'mpi_v7_clients.py'), n, timeout=300)
