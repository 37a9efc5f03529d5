"""``raise SystemExit(3)`` and the builtin ``exit(3)`` keep their status and read as an exit (issue 55 item 7).

As ``sys.exit(3)`` does (tests/faults/test_rank_gone.py): the rank that waits ends the job with
one line, ``exited with status 3``, and the job's status is 3; under the global except hook the
leaving rank aborts the job with 3 at once.
"""

import os
import re
import sys

import pytest

from chainermn_comm.protocol import VARIABLES
from chainermn_comm.testing import run_mpi

HERE = os.path.dirname(os.path.abspath(__file__))
JOB = os.path.join(HERE, 'jobs', 'job_system_exit.py')
DEFAULTS = {name: None for name in VARIABLES}


def report(res):
    return 'status {} after {:.1f}s{}\n--- stdout ---\n{}\n--- stderr ---\n{}'.format(
        res.returncode, res.seconds, ' (TIMED OUT)' if res.timed_out else '',
        res.stdout[-4000:], res.stderr[-8000:])


#: Python 3.12+ sees a SystemExit leave the main module (sys.monitoring); 3.11 only where it was raised.
IN_FUNCTION = ['raise_in_function'] if hasattr(sys, 'monitoring') else []


@pytest.mark.parametrize('mode', ['raise', 'builtin', 'builtin_in_function'] + IN_FUNCTION)
@pytest.mark.parametrize('n', [2, 3])
def test_system_exit_reads_as_an_exit_with_its_status(n, mode):
    res = run_mpi([JOB, mode], n, timeout=90, env=DEFAULTS)
    assert not res.timed_out and res.returncode == 3, report(res)
    lines = re.findall(r'^chainermn: rank {last} \(host [^)]+\) exited with status 3 at collective call '
                       r'#3; rank 0 \(host [^)]+\) waits in collective call #4 allreduce\(.*\), which rank '
                       r'{last} will never join: ending the job with MPI_Abort\(3\)$'.format(last=n - 1),
                       res.stderr, re.M)
    assert len(lines) == 1, report(res)
    assert 'its program returned' not in res.stderr and 'job ran to the end' not in res.stdout, report(res)


@pytest.mark.parametrize('mode', ['raise', 'builtin'])
def test_system_exit_under_the_hook_aborts_with_its_status(mode):
    res = run_mpi([JOB, mode, 'hook'], 2, timeout=90, env=DEFAULTS)
    assert not res.timed_out and res.returncode == 3, report(res)
    assert 'sys.exit(3) on rank 1; calling MPI_Abort(3) to stop all ranks' in res.stderr, report(res)


@pytest.mark.skipif(hasattr(sys, 'monitoring'), reason='Python 3.12+ keeps the status (the test above)')
def test_system_exit_raised_in_a_function_on_python_311_is_an_exit_of_unknown_status():
    res = run_mpi([JOB, 'raise_in_function'], 2, timeout=90, env=DEFAULTS)
    assert not res.timed_out and res.returncode != 0, report(res)
    assert re.search(r'^chainermn: rank 1 \(host [^)]+\) exited \(by a SystemExit whose status '
                     r'Python 3.11 cannot tell: sys.exit\(n\) keeps it\) at collective call #3', res.stderr,
                     re.M), report(res)
    assert 'its program returned' not in res.stderr and 'job ran to the end' not in res.stdout, report(res)
