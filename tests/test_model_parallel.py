"""One forward pass per update on every rank of a model-parallel pair (the scripts: test_examples.py)."""

import os

import pytest

from chainermn_comm.testing import run_pytest_under_mpi

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'model_parallel')


@pytest.mark.parametrize('n,env', [(2, {}), (4, {}), (4, {'CHAINERMN_DEBUG': '1'})],
                         ids=['2', '4', '4-debug'])
def test_one_forward_per_update(n, env):
    run_pytest_under_mpi(os.path.join(HERE, 'mpi_forward_once.py'), n, timeout=300, env=env)
