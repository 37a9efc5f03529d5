"""A fork()ed child's end is not its rank's (issue 55 item 1): no exit notice, no abort, whatever it does.

Rank 1 forks children that end with ``sys.exit(0)``, ``sys.exit(3)``, ``os._exit``, an uncaught
exception, ``raise SystemExit``, the builtin ``exit`` and a normal end, five rounds of each in one
job, while the other ranks wait in the next all-reduce; the job must train to the end, with and
without the global except hook.
"""

import os
import re

import pytest

from chainermn_comm.protocol import VARIABLES
from chainermn_comm.testing import run_mpi

HERE = os.path.dirname(os.path.abspath(__file__))
JOB = os.path.join(HERE, 'jobs', 'job_fork.py')
#: No CHAINERMN_* variable (the exit notice on, as by default).
DEFAULTS = {name: None for name in VARIABLES}


def report(res):
    return 'status {} after {:.1f}s{}\n--- stdout ---\n{}\n--- stderr ---\n{}'.format(
        res.returncode, res.seconds, ' (TIMED OUT)' if res.timed_out else '',
        res.stdout[-4000:], res.stderr[-8000:])


@pytest.mark.parametrize('hook', ['', 'hook'])
@pytest.mark.parametrize('n', [2, 3])
def test_forked_children_never_end_the_job(n, hook):
    res = run_mpi([JOB] + ([hook] if hook else []), n, timeout=180, env=DEFAULTS)
    assert not res.timed_out and res.returncode == 0, report(res)
    # 5 rounds of 8 ways, one all-reduce of ones each, plus none counted before: 40 * n.
    ends = re.findall(r'job ran to the end: (\d+)', res.stdout)  # the ranks' lines may interleave
    assert ends == [str(40 * n)] * n, report(res)
    assert ('children: exit0=0 exit3=3 _exit0=0 _exit5=5 raise=1 systemexit4=4 builtin_exit2=2 '
            'return=0') in res.stdout, report(res)
    assert 'MPI_Abort' not in res.stderr and 'will never join' not in res.stderr, report(res)
    # Each child's uncaught exception is printed once, as Python prints it (5 rounds).
    assert res.stderr.count('RuntimeError: injected failure in a forked child') == 5, report(res)
