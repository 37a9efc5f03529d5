"""Communication hooks at 1, 2 and 3 ranks (and 4 ranks on 2 simulated nodes)."""

import os

import pytest

from chainermn_comm.testing import run_pytest_under_mpi

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.mark.parametrize('n,env', [(1, {}), (2, {}), (3, {}), (4, {'CHAINERMN_RANKS_PER_NODE': '2'}),
                                   (2, {'CHAINERMN_RANKS_PER_NODE': '1'})],
                         ids=['1rank', '2ranks', '3ranks', '2x2-simulated', '2x1-simulated'])
def test_hooks(n, env):
    run_pytest_under_mpi(os.path.join(HERE, 'mpi', 'mpi_hooks.py'), n, timeout=240, env=env)
