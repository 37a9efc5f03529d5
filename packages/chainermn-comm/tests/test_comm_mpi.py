"""Run every communicator method on 1, 2, 3 ranks and on simulated 2-node layouts (3 and 4 ranks)."""

import os

import pytest

from chainermn_comm.testing import run_pytest_under_mpi

HERE = os.path.dirname(os.path.abspath(__file__))
API = os.path.join(HERE, 'mpi', 'mpi_comm_api.py')


@pytest.mark.parametrize('n', [1, 2, 3])
def test_comm_api(n):
    run_pytest_under_mpi(API, n, timeout=240)


@pytest.mark.parametrize('n', [3, 4])
def test_comm_api_two_simulated_nodes(n):
    # Nodes of 2 consecutive ranks: inter_size == 2, and at n=3 the nodes differ in size.
    res = run_pytest_under_mpi(API, n, timeout=240, env={'CHAINERMN_RANKS_PER_NODE': '2'})
    assert 'passed' in res.stdout


@pytest.mark.slow
def test_messages_over_2gib():
    # About 50 s and 10 GB peak on the 2-core dev machine; first touches of fresh memory dominate.
    run_pytest_under_mpi(os.path.join(HERE, 'mpi', 'mpi_big.py'), 2, timeout=480,
                         env={'CHAINERMN_TIMEOUT': '400'})
