"""Thread pools sized per rank at communicator creation, at 1, 2 and 3 ranks (``chainermn_comm.threads``)."""

import os

import pytest

from chainermn_comm.testing import run_pytest_under_mpi

HERE = os.path.dirname(__file__)
SCRIPT = os.path.join(HERE, 'mpi', 'mpi_threads.py')
CPUS = len(os.sched_getaffinity(0))


def _run(n, expect, source, env=None, warn=None):
    env = dict(env or {}, CHAINERMN_TEST_THREADS=str(expect), CHAINERMN_TEST_THREADS_SOURCE=source,
               CHAINERMN_TEST_THREADS_WARN='1' if (n > CPUS if warn is None else warn) else '0')
    clean = {k: '' for k in ('OMP_NUM_THREADS', 'OPENBLAS_NUM_THREADS', 'MKL_NUM_THREADS',
                             'CHAINERMN_THREADS', 'CHAINERMN_THREADS_CHOSEN')}
    run_pytest_under_mpi(SCRIPT, n, timeout=180, env=dict(clean, **env))


@pytest.mark.parametrize('n', [1, 2, 3])
def test_each_rank_gets_its_share_of_the_cpus(n):
    _run(n, max(1, CPUS // n), 'rule')


def test_the_users_variables_win():
    _run(2, 2, 'OMP_NUM_THREADS', {'OMP_NUM_THREADS': '2'})
    _run(3, 2, 'CHAINERMN_THREADS', {'CHAINERMN_THREADS': '2', 'OMP_NUM_THREADS': '1'})
    _run(2, 0, 'CHAINERMN_THREADS', {'CHAINERMN_THREADS': '0'})


def test_ranks_on_fewer_cpus_than_ranks_are_warned_about_once():
    # A node of one CPU: the launcher (and so every rank) may run on CPU 0 only.
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(before)})
    try:
        _run(2, 1, 'rule', warn=True)
    finally:
        os.sched_setaffinity(0, before)
