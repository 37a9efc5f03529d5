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


@pytest.mark.parametrize('n,mode,per_node', [(2, 'thread', None), (2, 'inline', None), (3, 'thread', None),
                                             (3, 'inline', None), (4, 'thread', '2')])
def test_sharded_optimizer_with_overlap(n, mode, per_node):
    # Buckets of 2 KiB reduce-scattered to their owners while backward runs (thread or inline).
    env = {'CHAINERMN_OVERLAP_MODE': mode, 'CHAINERMN_OVERLAP_BUCKET_BYTES': '2048'}
    if per_node:
        env['CHAINERMN_RANKS_PER_NODE'] = per_node
    run_pytest_under_mpi(os.path.join(HERE, 'mpi', 'mpi_sharded.py'), n, timeout=300,
                         extra_args=['-k', 'overlap'], env=env)
