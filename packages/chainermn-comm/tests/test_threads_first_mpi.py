"""The thread rule counts the job's ranks on the node when the first communicator spans less (3 ranks)."""

import os

import pytest

from chainermn_comm.testing import run_pytest_under_mpi

HERE = os.path.dirname(__file__)
SCRIPT = os.path.join(HERE, 'mpi', 'mpi_threads_first.py')
CPUS = len(os.sched_getaffinity(0))
CLEAN = {k: '' for k in ('OMP_NUM_THREADS', 'OPENBLAS_NUM_THREADS', 'MKL_NUM_THREADS',
                         'CHAINERMN_THREADS', 'CHAINERMN_THREADS_CHOSEN')}


def _run(first, expect, source, env=None):
    env = dict(CLEAN, **(env or {}), CHAINERMN_TEST_FIRST=first, CHAINERMN_TEST_THREADS=str(expect),
               CHAINERMN_TEST_THREADS_SOURCE=source, CHAINERMN_TEST_THREADS_WARN='1' if 3 > CPUS else '0')
    run_pytest_under_mpi(SCRIPT, 3, timeout=180, env=env)


@pytest.mark.parametrize('first', ['self', 'split'])
def test_a_first_communicator_on_part_of_the_job_counts_every_rank_of_the_node(first):
    _run(first, max(1, CPUS // 3), 'rule')


def test_the_users_limits_still_win():
    _run('split', 2, 'CHAINERMN_THREADS', {'CHAINERMN_THREADS': '2'})
    _run('self', 2, 'OMP_NUM_THREADS', {'OMP_NUM_THREADS': '2'})
