"""A setting that changes what ranks send, on one node only, ends the job at once naming it (issue 55):
2 nodes of namespaces, one rank each, the setting on node1's rank."""

import os

import pytest

from chainermn_comm.protocol import VARIABLES

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
JOB = os.path.join(ROOT, 'tests', 'cluster', 'jobs', 'job_settings.py')
DEFAULTS = {name: None for name in VARIABLES if name != 'CHAINERMN_NODE_LOCAL'}
CASES = [('CHAINERMN_DEBUG', '1', '1 on rank 1', 'unset (default 0) on rank 0'),
         ('CHAINERMN_CHECK', '0', '0 on rank 1', 'unset (default 1) on rank 0'),
         ('CHAINERMN_TUNE', '0', '0 on rank 1', 'unset (default 1) on rank 0'),
         ('CHAINERMN_CHUNK_BYTES', '65536', '65536 on rank 1', 'unset on rank 0')]


def test_one_nodes_setting_ends_the_job_within_seconds_naming_it(cluster2):
    for name, value, theirs, ours in CASES:
        res = cluster2.mpiexec([JOB, name, value], timeout=90, env=DEFAULTS)
        report = 'status {} after {:.1f}s\n--- stdout ---\n{}\n--- stderr ---\n{}'.format(
            res.returncode, res.seconds, res.stdout[-4000:], res.stderr[-8000:])
        assert not res.timed_out and res.seconds < 60, report
        assert res.returncode != 0 and 'CREATED' not in res.stdout, report
        assert '  {}: {}; {}\n'.format(name, ours, theirs) in res.stderr, report
        assert res.stderr.count('ValueError, raised by every rank together: rank 0 reports it') == 1, report
