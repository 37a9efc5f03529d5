"""The reduce-scatter / all-gather of owned arrays (sharded optimizer state) at 1, 2 and 3 ranks."""

import os

import pytest

from chainermn_comm.testing import run_pytest_under_mpi

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, 'mpi', 'mpi_shard.py')
FAKE = os.path.join(HERE, 'fakecupy')


@pytest.mark.parametrize('n', [1, 2, 3])
def test_shard_collectives_host(n):
    res = run_pytest_under_mpi(SCRIPT, n, timeout=240,
                               env={'CHAINERMN_TEST_SHARD_COMMS': 'naive'})
    assert 'passed' in res.stdout


def test_shard_collectives_two_simulated_nodes():
    run_pytest_under_mpi(SCRIPT, 3, timeout=240,
                         env={'CHAINERMN_TEST_SHARD_COMMS': 'naive', 'CHAINERMN_RANKS_PER_NODE': '2'})


@pytest.mark.parametrize('n', [2, 3])
def test_shard_collectives_through_node_shared_memory_in_small_rounds(n):
    # A window of 2 x 4 KiB per rank: the shares take many rounds through node-shared memory.
    res = run_pytest_under_mpi(SCRIPT, n, timeout=240, env={
        'CHAINERMN_TEST_SHARD_COMMS': 'naive', 'CHAINERMN_SHM_CHUNK_BYTES': '4096',
        'CHAINERMN_TEST_SHARD_EXPECT_NODE': '1'})
    assert 'passed' in res.stdout


@pytest.mark.parametrize('setting', [('CHAINERMN_SHM_REDUCE', '0'), ('CHAINERMN_SHM_CHUNK_BYTES', '64')])
def test_shard_collectives_with_mpi_messages_on_one_node(setting):
    # CHAINERMN_SHM_REDUCE=0, as for the average, or a window too small for a slot of 64 bytes
    # per rank: the shares move as MPI messages.
    res = run_pytest_under_mpi(SCRIPT, 2, timeout=240, env={
        'CHAINERMN_TEST_SHARD_COMMS': 'naive', setting[0]: setting[1],
        'CHAINERMN_TEST_SHARD_EXPECT_NODE': '0'})
    assert 'passed' in res.stdout


@pytest.mark.parametrize('chunk', [None, '4096'])
def test_shard_collectives_across_simulated_nodes_of_two(chunk):
    # 2 nodes x 2 ranks: each node's sum through node-shared memory, then across nodes over MPI.
    env = {'CHAINERMN_TEST_SHARD_COMMS': 'naive', 'CHAINERMN_RANKS_PER_NODE': '2',
           'CHAINERMN_TEST_SHARD_EXPECT_NODE': '1', 'CHAINERMN_TEST_SHARD_NODES': '1'}
    if chunk:
        env['CHAINERMN_SHM_CHUNK_BYTES'] = chunk
    res = run_pytest_under_mpi(SCRIPT, 4, timeout=240, env=env)
    assert 'passed' in res.stdout


@pytest.mark.parametrize('n', [1, 2, 3])
def test_shard_collectives_on_the_gpu_stand_in(n):
    path = os.pathsep.join([FAKE] + [p for p in os.environ.get('PYTHONPATH', '').split(os.pathsep) if p])
    res = run_pytest_under_mpi(SCRIPT, n, timeout=240, env={
        'PYTHONPATH': path, 'CHAINERMN_TEST_SHARD_COMMS': 'pure_nccl,flat', 'CHAINERMN_TEST_SHARD_GPU': '1',
        'CHAINERMN_CUDA_AWARE': '0', 'CUPY_FAKE_MPI_CUDA_AWARE': '0'})
    assert 'passed' in res.stdout
