"""One switch leaves the process alone (chainermn_comm.process); by default everything is installed."""

import os
import re

import pytest

from chainermn_comm.testing import run_mpi

HERE = os.path.dirname(__file__)
SCRIPT = os.path.join(HERE, 'mpi', 'mpi_process_alone.py')
#: Variables that would change what is installed; the runs start without them.
CLEAN = {k: None for k in ('OMP_NUM_THREADS', 'OPENBLAS_NUM_THREADS', 'MKL_NUM_THREADS', 'CHAINERMN_THREADS',
                           'CHAINERMN_THREADS_CHOSEN', 'CHAINERMN_PROCESS_WIDE', 'CHAINERMN_EXIT_NOTICE',
                           'CHAINERMN_FORCE_ABORT_ON_EXCEPTION')}


@pytest.mark.parametrize('mode,env', [('default', {}), ('variable', {'CHAINERMN_PROCESS_WIDE': '0'}),
                                      ('call', {})])
def test_what_is_installed_and_the_switch(mode, env):
    res = run_mpi([SCRIPT], 2, timeout=120, env=dict(CLEAN, CHAINERMN_TEST_MODE=mode, **env))
    report = 'status {}\n--- stdout ---\n{}\n--- stderr ---\n{}'.format(res.returncode, res.stdout, res.stderr)
    assert not res.timed_out and res.returncode == 0, report
    # the two ranks share one pipe: find each rank's line wherever the other's output fell
    assert sorted(re.findall(r'PROCESS-CHECKED (\w+) (\d)', res.stdout)) == [(mode, '0'), (mode, '1')], report
