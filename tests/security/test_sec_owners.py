"""Two jobs, one checkpoint directory: the second is refused at start, a dead job's claim is taken over.

Root jobs of 2 ranks (``jobs/sec_owner_job.py``).  The issue's finding: two runs with the same
path and name at once ended with every generation holding rank 0 of one job and rank 1 of the
other, and exited 0 with ranks holding different weights.  Now the second job is refused at start
naming the first (host, pid, start time), and the first ends with one lineage and equal weights.
"""

import json
import os
import socket
import subprocess
import time

import pytest

from chainermn_comm.testing import run_mpi
from chainermn_train.checkpoint.ownership import owner
from chainermn_train.checkpoint.read import npz

HERE = os.path.dirname(os.path.abspath(__file__))
JOB = os.path.join(HERE, 'jobs', 'sec_owner_job.py')


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


def _two_jobs(base, launch_first):
    """Run job 1 (``launch_first(argv, on_start)``) holding DIR while job 2 starts on DIR (2 local ranks).

    Return (DIR, job 1's result, job 2's result, job 1's JSON lines, job 2's JSON lines).
    """
    d = os.path.join(base, 'ckpt')
    os.mkdir(d, 0o700)
    fifo = os.path.join(base, 'go')
    os.mkfifo(fifo, 0o600)
    out1, out2 = os.path.join(base, 'first'), os.path.join(base, 'second')
    second = []

    def while_first_holds(proc):
        line = proc.stdout.readline()   # the first job has claimed the directory and saved
        assert line.strip() == b'READY', line
        second.append(run_mpi([JOB, 'start', d, out2], 2, timeout=120))
        with open(fifo, 'w') as f:        # let the first job go on
            f.write('go')

    first = launch_first([JOB, 'hold', d, fifo, out1], while_first_holds)
    assert first.returncode == 0 and not first.timed_out, _report(first)
    assert second, 'the second job never ran\n' + _report(first)
    return d, first, second[0], _results(out1), _results(out2)


def test_second_job_on_a_live_jobs_directory_is_refused_and_nothing_mixes(base):
    d, first, res2, docs1, docs2 = _two_jobs(
        base, lambda argv, on_start: run_mpi(argv, 2, timeout=180, on_start=on_start))
    assert res2.returncode == 0, _report(res2)
    refused = [doc for doc in docs2 if doc['case'] == 'start']
    assert sorted(doc['rank'] for doc in refused) == [0, 1], docs2
    host = socket.gethostname()
    for doc in refused:
        assert doc['error'][0] == 'CheckpointInUseError', doc
        text = doc['error'][1]
        assert "another job is writing snapshots 'run' into {}".format(d) in text, text
        assert 'host {}, pid '.format(host) in text and ', started 20' in text, text
        assert 'Stop that job, or give this one another path or name' in text, text
    assert refused[0]['error'][1] == refused[1]['error'][1]
    held = {doc['rank']: doc for doc in docs1 if doc['case'] == 'hold'}
    for r in (0, 1):
        assert held[r]['loaded'] == 2 and held[r]['same'] is True, held
        assert held[r]['weights'] == [12.0, 4.0], held   # 2.0 * (6 + 2): the first job's own values
    # Every generation on disk is the first job's: one lineage, no file of the second job.
    names = sorted(n for n in os.listdir(d) if not n.startswith('.'))
    assert names == ['run.0.1', 'run.0.2', 'run.1.1', 'run.1.2'], names
    runs = {npz.read_meta(os.path.join(d, n))['run'] for n in names}
    assert runs == {held[0]['run']}, runs


def _record(path, **fields):
    with open(path, 'w') as f:
        json.dump(fields, f)
    os.chmod(path, 0o644)


def test_claims_of_dead_jobs_are_taken_over_and_a_live_one_elsewhere_is_refused(base):
    me = owner.identity()
    gone = subprocess.Popen(['sleep', '60'])
    dead = dict(me, pid=gone.pid, pid_start=owner._start_ticks(gone.pid))
    gone.kill()
    gone.wait()
    now = time.time()
    cases = {
        'dead_here': [dict(dead, token='t-dead', started=now - 50)],
        'reused_pid': [dict(me, pid=os.getpid(), pid_start=(me['pid_start'] or 0) + 1, token='t-reused',
                            started=now - 50)],
        'stale_elsewhere': [dict(host='elsewhere.example', boot='b', pidns='p', pid=4242, pid_start=1,
                                 token='t-stale', started=now - 5000), now - owner.STALE_SECONDS - 60],
        'live_elsewhere': [dict(host='elsewhere.example', boot='b', pidns='p', pid=4242, pid_start=1,
                                token='t-live', started=now - 50), now - 5],
        # a fresh record of another host, but of the launcher's previous attempt: that job is gone
        'earlier_attempt': [dict(host='elsewhere.example', boot='b', pidns='p', pid=4242, pid_start=1,
                                 token='t-attempt', started=now - 50,
                                 attempt=['launch:' + os.path.join(base, 'progress'), 0]), now - 5],
    }
    dirs = []
    for name, (rec, *mtime) in cases.items():
        d = os.path.join(base, name)
        os.mkdir(d, 0o700)
        path = os.path.join(d, '.run.0.owner')
        _record(path, **dict(rec, rank=0))
        if mtime:
            os.utime(path, (mtime[0], mtime[0]))
        dirs.append(d)
    out = os.path.join(base, 'claims')
    # as the launcher's second attempt (python -m chainermn launch sets these)
    res = run_mpi([JOB, 'claim', out] + dirs, 2, timeout=120,
                  env={'CHAINERMN_LAUNCH_PROGRESS': os.path.join(base, 'progress'),
                       'CHAINERMN_LAUNCH_RESTARTS': '1'})
    assert res.returncode == 0, _report(res)
    got = {}
    for doc in _results(out):
        got.setdefault(os.path.basename(doc['case']), {})[doc['rank']] = doc
    for name in ('dead_here', 'reused_pid', 'stale_elsewhere', 'earlier_attempt'):
        assert [got[name][r]['error'] for r in (0, 1)] == [None, None], got[name]
        said = [w for r in (0, 1) for w in got[name][r]['warnings'] if 'took over' in w]
        assert len(said) == 1 and 'from job(s) that are gone' in said[0], said
    assert 'host {}, pid {}'.format(me['host'], gone.pid) in [
        w for r in (0, 1) for w in got['dead_here'][r]['warnings']][0]
    for r in (0, 1):
        err = got['live_elsewhere'][r]['error']
        assert err[0] == 'CheckpointInUseError', err
        assert 'host elsewhere.example, pid 4242' in err[1] and 'heartbeat' in err[1], err
    # The live job's record stays; the dead ones' records were replaced by this job's, now released.
    with open(os.path.join(base, 'live_elsewhere', '.run.0.owner')) as f:
        assert json.load(f)['token'] == 't-live'


@pytest.fixture
def cluster2():
    """Two namespace hosts (skipped, naming what is missing, where none can be made)."""
    from chainermn_tools.cluster import Cluster, missing
    problems = missing(need_tc=False)
    if problems:
        pytest.skip('cannot build a cluster of namespaces here; missing: ' + '; '.join(problems))
    cluster = Cluster(nodes=2).start()
    try:
        yield cluster
    finally:
        cluster.close()


def test_a_second_job_on_another_host_is_refused_naming_the_first_jobs_host(base, cluster2):
    """The first job runs on namespace hosts node0 and node1, the second on this host: for its ranks
    the owner records are another host's (the rule is the heartbeat, not the pid)."""
    d, first, res2, docs1, docs2 = _two_jobs(
        base, lambda argv, on_start: cluster2.mpiexec(argv, ranks_per_node=1, timeout=180, on_start=on_start))
    assert res2.returncode == 0, _report(res2)
    refused = [doc for doc in docs2 if doc['case'] == 'start']
    assert sorted(doc['rank'] for doc in refused) == [0, 1], docs2
    for doc in refused:
        assert doc['error'][0] == 'CheckpointInUseError', doc
        assert "another job is writing snapshots 'run' into {}".format(d) in doc['error'][1], doc
        assert 'host {}, pid '.format(cluster2.hostnames[0]) in doc['error'][1], doc
    held = {doc['rank']: doc for doc in docs1 if doc['case'] == 'hold'}
    assert all(held[r]['loaded'] == 2 and held[r]['same'] and held[r]['weights'] == [12.0, 4.0]
               for r in (0, 1)), held
    names = sorted(n for n in os.listdir(d) if not n.startswith('.'))
    assert names == ['run.0.1', 'run.0.2', 'run.1.1', 'run.1.2'], names
