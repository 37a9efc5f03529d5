"""recv_obj(source, status=None, tag=ANY_TAG) at 1, 2 and 3 ranks, naive and the GPU communicators."""

import os
import re

import pytest

from chainermn_comm.testing import run_pytest_under_mpi

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, 'mpi', 'mpi_recv_obj.py')
GPU_NAMES = ('flat', 'pure_nccl', 'hierarchical', 'two_dimensional', 'non_cuda_aware')


@pytest.mark.parametrize('n', [1, 2, 3])
def test_recv_obj_v7_signature(n):
    res = run_pytest_under_mpi(SCRIPT, n, timeout=120, env={'CHAINERMN_TIMEOUT': '60'})
    assert re.search(r'\b5 passed' if n > 1 else r'\b2 passed, 3 skipped', res.stdout), res.stdout[-2000:]


@pytest.mark.parametrize('n', [2, 3])
def test_recv_obj_v7_signature_gpu_communicators_on_the_stand_in(n):
    fake = os.path.join(HERE, 'fakecupy')
    path = os.pathsep.join([fake] + [p for p in os.environ.get('PYTHONPATH', '').split(os.pathsep) if p])
    res = run_pytest_under_mpi(SCRIPT, n, timeout=180, env={
        'PYTHONPATH': path, 'CHAINERMN_TEST_RECV_OBJ_COMMS': ','.join(GPU_NAMES),
        'CHAINERMN_CUDA_AWARE': '0', 'CUPY_FAKE_MPI_CUDA_AWARE': '0', 'CHAINERMN_TIMEOUT': '60'})
    assert re.search(r'\b{} passed'.format(5 * len(GPU_NAMES)), res.stdout), res.stdout[-2000:]
