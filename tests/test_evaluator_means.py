"""The multi-node evaluator equals Chainer's one-process Evaluator over all ranks' batches (1-3 ranks)."""

import os

import pytest

from chainermn_comm.testing import run_pytest_under_mpi

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'evaluator')


@pytest.mark.parametrize('n', [1, 2, 3])
def test_evaluator_means(n):
    run_pytest_under_mpi(os.path.join(HERE, 'mpi_evaluator_means.py'), n, timeout=180,
                         env={'CHAINERMN_TIMEOUT': '60'})
