"""Two jobs, one checkpoint directory, different hosts: the second is refused, naming the first's host.

The owner records of a job on the namespace cluster name hosts node0 and node1; a second job
started on this host (another host for those records: the rule is the heartbeat, not the pid)
must be refused at start naming node0, and the first job ends with its own lineage only.  Root
jobs of 2 ranks (``tests/security/jobs/sec_owner_job.py``, as in tests/security/test_sec_owners.py).
"""

import json
import os
import shutil
import tempfile

import pytest

from chainermn_comm.testing import run_mpi

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
JOB = os.path.join(ROOT, 'tests', 'security', 'jobs', 'sec_owner_job.py')


@pytest.fixture
def private_dir():
    d = tempfile.mkdtemp(prefix='chainermn-sec-cluster-')
    os.chmod(d, 0o700)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _results(out):
    docs = []
    for r in (0, 1):
        if os.path.exists('{}.{}'.format(out, r)):
            with open('{}.{}'.format(out, r)) as f:
                docs += [json.loads(line) for line in f]
    return docs


def _report(res):
    return 'exit {}\n--- stdout ---\n{}\n--- stderr ---\n{}'.format(res.returncode, res.stdout[-3000:],
                                                                     res.stderr[-5000:])


def test_a_second_job_on_another_host_is_refused_naming_the_first_jobs_host(require_cluster, cluster2,
                                                                            private_dir):
    d = os.path.join(private_dir, 'ckpt')
    os.mkdir(d, 0o700)
    fifo = os.path.join(private_dir, 'go')
    os.mkfifo(fifo, 0o600)
    out1, out2 = os.path.join(private_dir, 'first'), os.path.join(private_dir, 'second')
    second = []

    def while_first_holds(proc):
        line = proc.stdout.readline()   # the first job (node0, node1) has claimed the directory
        assert line.strip() == b'READY', line
        second.append(run_mpi([JOB, 'start', d, out2], 2, timeout=120))
        with open(fifo, 'w') as f:
            f.write('go')

    first = cluster2.mpiexec([JOB, 'hold', d, fifo, out1], ranks_per_node=1, timeout=180,
                             on_start=while_first_holds)
    assert first.returncode == 0 and not first.timed_out, _report(first)
    assert second, 'the second job never ran'
    res2 = second[0]
    assert res2.returncode == 0, _report(res2)
    refused = [doc for doc in _results(out2) if doc['case'] == 'start']
    assert sorted(doc['rank'] for doc in refused) == [0, 1], _results(out2)
    first_host = cluster2.hostnames[0]
    for doc in refused:
        assert doc['error'][0] == 'CheckpointInUseError', doc
        text = doc['error'][1]
        assert "another job is writing snapshots 'run' into {}".format(d) in text, text
        assert 'host {}, pid '.format(first_host) in text, text
    held = {doc['rank']: doc for doc in _results(out1) if doc['case'] == 'hold'}
    for r in (0, 1):
        assert held[r]['loaded'] == 2 and held[r]['same'] is True, held
        assert held[r]['weights'] == [12.0, 4.0], held
    names = sorted(n for n in os.listdir(d) if not n.startswith('.'))
    assert names == ['run.0.1', 'run.0.2', 'run.1.1', 'run.1.2'], names
