"""A fork()ed child's end is not its rank's, across hosts too (issue 55 item 1): 2 nodes of namespaces,
one rank each; rank 1 forks children that end in 8 ways, 5 rounds, while rank 0 waits in the
next all-reduce on the other node. The job trains to the end with no exit notice."""

import os
import re

from chainermn_comm.protocol import VARIABLES

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
JOB = os.path.join(ROOT, 'tests', 'faults', 'jobs', 'job_fork.py')
DEFAULTS = {name: None for name in VARIABLES if name != 'CHAINERMN_NODE_LOCAL'}


def test_forked_children_on_one_node_never_end_the_job(cluster2):
    res = cluster2.mpiexec([JOB], timeout=180, env=DEFAULTS)
    report = 'status {} after {:.1f}s\n--- stdout ---\n{}\n--- stderr ---\n{}'.format(
        res.returncode, res.seconds, res.stdout[-4000:], res.stderr[-8000:])
    assert not res.timed_out and res.returncode == 0, report
    assert re.findall(r'job ran to the end: (\d+)', res.stdout) == ['80', '80'], report
    assert ('children: exit0=0 exit3=3 _exit0=0 _exit5=5 raise=1 systemexit4=4 builtin_exit2=2 '
            'return=0') in res.stdout, report
    assert 'MPI_Abort' not in res.stderr and 'will never join' not in res.stderr, report
