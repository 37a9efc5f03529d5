"""An error every rank raises together is never lost when its reporting rank catches it (issue 55 item 4).

Every rank's all-reduce raises the shape mismatch together; rank 0 (which reports such errors)
catches it and goes on, the others do not.  Without the hook rank 0 prints the report once, when
the others' exit notices show they ended with it, then ends the job; with the hook the other
ranks, after waiting for rank 0 to end the job, print it themselves.
"""

import os
import re

import pytest

from chainermn_comm.protocol import VARIABLES
from chainermn_comm.testing import run_mpi

HERE = os.path.dirname(os.path.abspath(__file__))
JOB = os.path.join(HERE, 'jobs', 'job_agreed_caught.py')
DEFAULTS = {name: None for name in VARIABLES}
MISMATCH = 'First difference: shape is (4,) on rank 0 but (5,) on rank 1.'


def report(res):
    return 'status {} after {:.1f}s{}\n--- stdout ---\n{}\n--- stderr ---\n{}'.format(
        res.returncode, res.seconds, ' (TIMED OUT)' if res.timed_out else '',
        res.stdout[-4000:], res.stderr[-8000:])


@pytest.mark.parametrize('n', [2, 3])
def test_the_reporting_rank_prints_what_it_caught_once(n):
    res = run_mpi([JOB], n, timeout=120, env=DEFAULTS)
    assert not res.timed_out and res.returncode == 1, report(res)
    assert 'rank 0 caught it' in res.stdout and 'job ran to the end' not in res.stdout, report(res)
    assert res.stderr.count(MISMATCH) == 1, report(res)
    assert re.search(r'^chainermn: \[rank 0 host [^\]]+\] the CommunicationError every rank raised '
                     r'together at collective call #2 was caught on this rank, which reports it; the '
                     r'other ranks ended with it:\nCommunicationError: rank 0: ranks disagree on the '
                     r'next collective call:\n', res.stderr, re.M), report(res)
    # The report comes before the line that ends the job.
    assert res.stderr.index(MISMATCH) < res.stderr.index('which rank 1 will never join'), report(res)
    assert len(re.findall(r'raised by every rank together: rank 0 reports it', res.stderr)) == n - 1, \
        report(res)


@pytest.mark.parametrize('n', [2, 3])
def test_with_the_hook_the_other_ranks_print_it_when_rank_0_stays_silent(n):
    res = run_mpi([JOB, 'hook'], n, timeout=120, env=DEFAULTS)
    assert not res.timed_out and res.returncode == 1, report(res)
    assert 1 <= res.stderr.count(MISMATCH) <= n - 1, report(res)
    assert 'did not end the job within 10 s' in res.stderr, report(res)
    assert res.stderr.index(MISMATCH) < res.stderr.index('did not end the job'), report(res)
