"""shard_state=True: the same parameters as unsharded, bit for bit on every rank, 1/N of the state."""

import os

import pytest

from chainermn_comm.testing import run_pytest_under_mpi

HERE = os.path.dirname(__file__)


@pytest.mark.parametrize('n', [1, 2, 3])
def test_sharded_optimizer(n):
    run_pytest_under_mpi(os.path.join(HERE, 'mpi', 'mpi_sharded.py'), n, timeout=300)


def test_sharded_optimizer_two_simulated_nodes():
    run_pytest_under_mpi(os.path.join(HERE, 'mpi', 'mpi_sharded.py'), 4, timeout=300,
                         env={'CHAINERMN_RANKS_PER_NODE': '2'})
