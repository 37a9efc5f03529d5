"""``comm_hook`` on the multi-node optimizer at 1, 2 and 3 ranks and on 2 simulated nodes."""

import os

import pytest

from chainermn_comm.testing import run_pytest_under_mpi

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.mark.parametrize('n,env', [(1, {}), (2, {}), (3, {}), (4, {'CHAINERMN_RANKS_PER_NODE': '2'})],
                         ids=['1rank', '2ranks', '3ranks', '2x2-simulated'])
def test_hooks_on_the_optimizer(n, env):
    run_pytest_under_mpi(os.path.join(HERE, 'mpi', 'mpi_hooks_train.py'), n, timeout=300, env=env)
