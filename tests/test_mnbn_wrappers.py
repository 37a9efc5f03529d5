"""The multi-node optimizer and evaluator train and evaluate what create_mnbn_model converted (1-3 ranks)."""

import os

import pytest

from chainermn_comm.testing import run_pytest_under_mpi

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'mnbn')


@pytest.mark.parametrize('n', [1, 2, 3])
def test_wrappers_use_the_converted_model(n):
    run_pytest_under_mpi(os.path.join(HERE, 'mpi_mnbn_wrappers.py'), n, timeout=240,
                         env={'CHAINERMN_TIMEOUT': '60'})
