"""create_mnbn_model converts what the forward pass runs (Chain, ChainList, Sequential, nested, shared links)."""

import os

import pytest

from chainermn_comm.testing import run_pytest_under_mpi

HERE = os.path.dirname(__file__)


@pytest.mark.parametrize('n', [1, 2, 3])
def test_create_mnbn_model(n):
    run_pytest_under_mpi(os.path.join(HERE, 'mpi', 'mpi_create_mnbn_model.py'), n, timeout=240,
                         env={'CHAINERMN_TIMEOUT': '60'})
