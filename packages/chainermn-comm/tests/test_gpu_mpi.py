"""GPU communicator tests under mpiexec (marked gpu: skipped without CuPy and a CUDA device)."""

import os

import pytest

from chainermn_comm import _gpu_support
from chainermn_comm.testing import run_pytest_under_mpi

HERE = os.path.dirname(__file__)
ALL = ('naive', 'flat', 'pure_nccl', 'single_node', 'hierarchical', 'two_dimensional', 'non_cuda_aware')
#: Paths that work with 2 ranks on one GPU: NCCL groups stay at one rank per GPU when every rank
#: is its own simulated node.
TWO_RANKS = ('naive', 'flat', 'hierarchical', 'two_dimensional', 'non_cuda_aware')

pytestmark = pytest.mark.gpu


def _need_gpu():
    pytest.importorskip('cupy')
    if not _gpu_support.gpu_available():
        pytest.skip(_gpu_support.cupy_status()[1])


def test_gpu_comms_one_rank():
    _need_gpu()
    run_pytest_under_mpi(os.path.join(HERE, 'mpi', 'mpi_gpu.py'), 1, timeout=600,
                         env={'CHAINERMN_TEST_GPU_COMMS': ','.join(ALL)})


def test_gpu_comms_two_ranks_sharing_a_gpu():
    _need_gpu()
    run_pytest_under_mpi(os.path.join(HERE, 'mpi', 'mpi_gpu.py'), 2, timeout=600,
                         env={'CHAINERMN_TEST_GPU_COMMS': ','.join(TWO_RANKS),
                              'CHAINERMN_RANKS_PER_NODE': '1'})
