"""create_mnbn_model's model moves to the device whole: on comm's NumPy stand-in for CuPy (1 and 2 ranks)."""

import os
import re

import pytest

from chainermn_comm.testing import run_pytest_under_mpi

HERE = os.path.dirname(os.path.abspath(__file__))
FAKE = os.path.join(HERE, '..', '..', 'chainermn-comm', 'tests', 'fakecupy')


@pytest.mark.parametrize('n', [1, 2])
def test_converted_model_on_the_stand_in(n):
    if not os.path.isdir(FAKE):
        pytest.skip('the stand-in for CuPy lives in the monorepo checkout')
    path = os.pathsep.join([os.path.abspath(FAKE)] + [
        p for p in os.environ.get('PYTHONPATH', '').split(os.pathsep) if p])
    res = run_pytest_under_mpi(os.path.join(HERE, 'mpi', 'mpi_create_mnbn_model_device.py'), n,
                               timeout=240, env={'PYTHONPATH': path, 'CHAINERMN_CUDA_AWARE': '0',
                                                 'CUPY_FAKE_MPI_CUDA_AWARE': '0',
                                                 'CHAINERMN_TIMEOUT': '60'})
    # The stand-in really ran them (without it the import fails): 16 moves, 3 of v7's cases.
    counts = [int(m) for m in re.findall(r'(\d+) passed', res.stdout)]
    assert len(counts) == n and min(counts) >= 19, res.stdout[-3000:]
