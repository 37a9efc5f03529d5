import os

import pytest

from chainermn_comm.testing import run_pytest_under_mpi

HERE = os.path.dirname(__file__)


@pytest.mark.slow
def test_scatter_object_dataset_over_2gib():
    run_pytest_under_mpi(os.path.join(HERE, 'mpi', 'mpi_scatter_big.py'), 2, timeout=600)
