"""Overlap on the GPU: NCCL on a side stream during backward (marked gpu: skipped without CuPy and a GPU)."""

import os

import pytest

from chainermn_comm import _gpu_support
from chainermn_comm.testing import run_pytest_under_mpi

HERE = os.path.dirname(__file__)

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize('n', [1, 2])
def test_device_overlap(n):
    cupy = pytest.importorskip('cupy')
    if not (_gpu_support.gpu_available() and _gpu_support.nccl_available()):
        pytest.skip(_gpu_support.cupy_status()[1] or 'NCCL is not available')
    gpus = cupy.cuda.runtime.getDeviceCount()
    if n > gpus:
        pytest.skip('NCCL needs one GPU per rank: {} ranks, {} GPU(s)'.format(n, gpus))
    run_pytest_under_mpi(os.path.join(HERE, 'mpi', 'mpi_overlap_gpu.py'), n, timeout=600,
                         env={'CHAINERMN_OVERLAP_MODE': 'stream'})
