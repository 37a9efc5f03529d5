"""Messages about a sub-communicator name ranks in the job's numbering (issue 55 item 2).

World rank, with the sub-communicator's own rank beside it: ``rank 2 (rank 1 of the split
communicator, host h)``, in the exit notice's line, the disagreement table, the invalid-input
error and the pointer line (which names the world rank that reports).  Groups {0, 2} and {1}
from ``comm.split`` at 3 ranks.
"""

import os
import re

from chainermn_comm.protocol import VARIABLES
from chainermn_comm.testing import run_mpi

HERE = os.path.dirname(os.path.abspath(__file__))
JOB = os.path.join(HERE, 'jobs', 'job_sub_names.py')
DEFAULTS = {name: None for name in VARIABLES}
SUB0 = 'rank 0 (rank 0 of the split communicator)'
SUB2 = 'rank 2 (rank 1 of the split communicator)'


def report(res):
    return 'status {} after {:.1f}s{}\n--- stdout ---\n{}\n--- stderr ---\n{}'.format(
        res.returncode, res.seconds, ' (TIMED OUT)' if res.timed_out else '',
        res.stdout[-6000:], res.stderr[-6000:])


def messages(out, rank):
    return re.findall(r'^MESSAGE {}\n(.*?)^END$'.format(rank), out, re.M | re.S)


def test_sub_communicator_ranks_are_named_by_their_world_rank():
    res = run_mpi([JOB], 3, timeout=120, env=DEFAULTS)
    assert not res.timed_out and res.returncode == 4, report(res)
    for rank, me in ((0, SUB0), (2, SUB2)):
        disagree, invalid = messages(res.stdout, rank)
        lines = disagree.splitlines()
        assert lines[0] == '{}: ranks disagree on the next collective call:'.format(me), report(res)
        assert re.match(r'  {}: collective call #2: allreduce\(shape=\(4,\), .* on host \S+{}$'.format(
            re.escape(SUB0), '   <- this rank' if rank == 0 else ''), lines[1]), report(res)
        assert re.match(r'  {}: collective call #2: allreduce\(shape=\(5,\), .* on host \S+{}$'.format(
            re.escape(SUB2), '   <- this rank' if rank == 2 else ''), lines[2]), report(res)
        assert lines[3] == 'First difference: shape is (4,) on {} but (5,) on {}.'.format(SUB0, SUB2), \
            report(res)
        assert re.match(r'{}: collective call #3 allreduce fails on every rank because of invalid input '
                        r'on rank 2 \(rank 1 of the split communicator, host \S+\)\.\nInvalid input on '
                        r'{}: TypeError: '.format(re.escape(me), re.escape(SUB2)), invalid), report(res)
    # Both ranks would point at world rank 0 (rank 0 of the sub-communicator), never at 'rank 1'.
    assert sorted(re.findall(r'^POINTER (\d) CommunicationError, raised by every rank together: rank (\d) '
                             r'reports it$', res.stdout, re.M)) == [('0', '0')] * 2 + [('2', '0')] * 2, \
        report(res)
    gone = re.findall(r'^chainermn: rank 2 \(rank 1 of the split communicator, host \S+\) exited with '
                      r'status 4 at collective call #4; rank 0 \(rank 0 of the split communicator, host '
                      r'\S+\) waits in collective call #5 allreduce\(shape=\(3,\), dtype=<f4, op=sum\), '
                      r'which rank 2 will never join: ending the job with MPI_Abort\(4\)$',
                      res.stderr, re.M)
    assert len(gone) == 1, report(res)
    assert 'job ran to the end' not in res.stdout, report(res)
