import os

import pytest

from chainermn_comm.testing import run_pytest_under_mpi

HERE = os.path.dirname(__file__)
SCRIPT = os.path.join(HERE, 'mpi', 'mpi_shm_reduce.py')


@pytest.mark.parametrize('n', [1, 2, 3])
def test_shm_reduce(n):
    run_pytest_under_mpi(SCRIPT, n, timeout=240, env={'EXPECT_SHM': '1' if n > 1 else '0'})


@pytest.mark.parametrize('n,expect', [(4, '1'), (3, '0')])
def test_shm_reduce_two_simulated_nodes(n, expect):
    """Four ranks: two nodes of two share memory per node and all-reduce across nodes.

    Three ranks: nodes of two and one rank; uneven nodes fall back to MPI messages.
    """
    run_pytest_under_mpi(SCRIPT, n, timeout=240,
                         env={'CHAINERMN_RANKS_PER_NODE': '2', 'EXPECT_SHM': expect})
