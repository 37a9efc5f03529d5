"""create_mnbn_model on a GPU: the whole converted model moves and runs there, v7's own cases included (marked gpu)."""

import os

import pytest

from chainermn_comm.testing import run_pytest_under_mpi

HERE = os.path.dirname(os.path.abspath(__file__))

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize('n', [1, 2])
def test_converted_model_on_the_gpu(n):
    cupy = pytest.importorskip('cupy')
    if getattr(cupy, 'IS_FAKE', False):
        pytest.skip('the NumPy stand-in for CuPy is on the path (test_create_mnbn_model_fakecupy.py runs it)')
    try:
        gpus = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:   # no driver or no device
        pytest.skip('no CUDA device: {}'.format(e))
    if n > gpus:
        pytest.skip('NCCL needs one GPU per rank: {} ranks, {} GPU(s)'.format(n, gpus))
    run_pytest_under_mpi(os.path.join(HERE, 'mpi', 'mpi_create_mnbn_model_device.py'), n, timeout=300,
                         env={'CHAINERMN_TIMEOUT': '120'})
