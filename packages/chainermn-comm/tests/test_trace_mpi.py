"""Tracing across ranks: files, one clock, nothing when unset, device time on the stand-in."""

import os

import pytest

from chainermn_comm.testing import run_pytest_under_mpi

HERE = os.path.dirname(os.path.abspath(__file__))
FILE = os.path.join(HERE, 'mpi', 'mpi_trace.py')


@pytest.mark.parametrize('n', [1, 2, 3])
def test_trace_files_on_one_clock(n, tmp_path):
    run_pytest_under_mpi(FILE, n, timeout=180, env={'CHAINERMN_TRACE': str(tmp_path / 'trace')})
    assert sorted(os.listdir(str(tmp_path / 'trace'))) == sorted(
        ['.trace.lock', 'trace.json'] + ['trace.rank{}.json'.format(r) for r in range(n)])


def test_unset_writes_nothing(tmp_path):
    run_pytest_under_mpi(FILE, 2, timeout=120, cwd=str(tmp_path))
    assert os.listdir(str(tmp_path)) == []


@pytest.mark.parametrize('n', [1, 2])
def test_gpu_communicators_time_the_device_on_the_stand_in(n, tmp_path):
    fake = os.path.join(HERE, 'fakecupy')
    path = os.pathsep.join([fake] + [p for p in os.environ.get('PYTHONPATH', '').split(os.pathsep) if p])
    run_pytest_under_mpi(FILE, n, timeout=180, env={
        'PYTHONPATH': path, 'CHAINERMN_TEST_GPU_COMMS': 'flat,pure_nccl',
        'CHAINERMN_CUDA_AWARE': '0', 'CUPY_FAKE_MPI_CUDA_AWARE': '0',
        'CHAINERMN_TRACE': str(tmp_path / 'trace')})
