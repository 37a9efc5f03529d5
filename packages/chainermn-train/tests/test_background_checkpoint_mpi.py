"""Background checkpoint writes: the per-rank tests at 1-3 ranks, and the kill points at 2 ranks."""

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile

import pytest

from chainermn_comm.testing import find_mpiexec, run_mpi, run_pytest_under_mpi

from chainermn_train.checkpoint.write import complete
from chainermn_train.checkpoint.write.background import KILL_POINTS

HERE = os.path.dirname(__file__)
JOB = os.path.join(HERE, 'mpi', 'bg_kill_job.py')
FULL_JOB = os.path.join(HERE, 'mpi', 'bg_disk_full_job.py')


@pytest.mark.parametrize('n', [1, 2, 3])
def test_background_checkpoint(n):
    run_pytest_under_mpi(os.path.join(HERE, 'mpi', 'mpi_background_checkpoint.py'), n, timeout=300)


def _killed(case, path, how):
    res = run_mpi([JOB, 'write', path, case, how], 2, timeout=90)
    report = '{} ({}): status {}\n{}\n{}'.format(case, how, res.returncode, res.stdout[-3000:],
                                                 res.stderr[-3000:])
    assert not res.timed_out, report
    killed = 'DONE rank ' + case.split('@')[1]
    assert res.returncode != 0 and killed not in res.stdout, report   # it was killed


def _resume(case, path, ranks, want=None):
    res = run_mpi([JOB, 'resume', path] + ([str(want)] if want is not None else []), ranks,
                  timeout=90)
    report = '{} resume at {} rank(s): status {}\n{}\n{}'.format(
        case, ranks, res.returncode, res.stdout[-3000:], res.stderr[-5000:])
    assert res.returncode == 0, report
    got = sorted(re.findall(r'LOADED (\d+) rank (\d)', res.stdout))
    assert len(got) == ranks and len({g[0] for g in got}) == 1, report
    return int(got[0][0])


def test_kill_at_every_point_of_a_background_save_resumes_from_the_newest_complete_generation():
    # Each point of a save (copy, write, fsync/rename, agreement, record) on rank 1, and the
    # write's points on rank 0: the job dies there; the next job loads exactly the newest
    # generation whose every file reached the disk (15 or 10), removes the rest, and its weights
    # are that generation's.
    cases = ['{}@1'.format(p) for p in KILL_POINTS if p != 'before-poll'] + [
        '{}@0'.format(p) for p in ('mid-write', 'before-rename', 'after-rename')]
    loaded = {}
    for case in cases:
        path = tempfile.mkdtemp(prefix='bg-kill-')
        try:
            _killed(case, path, 'settle')
            loaded[case] = _resume(case, path, 2)
        finally:
            shutil.rmtree(path, ignore_errors=True)
    # Killed before its own file of 15 existed: 15 is never loaded.
    for p in ('before-copy', 'after-copy', 'mid-write', 'before-rename'):
        assert loaded[p + '@1'] == 10, loaded
    # Killed after every rank's write finished (rank 1 waited for its own at the agreement, and
    # rank 0 for its own before it): 15 is complete and loaded.
    for p in ('before-record', 'after-record'):
        assert loaded[p + '@1'] == 15, loaded


def test_kill_at_every_point_of_the_poll_resumes_from_the_newest_complete_generation():
    # The agreement reached by polling every iteration (the extension's way): a rank killed after
    # its write is durable but before it told the others (before-poll), before the agreement, or
    # before or after its own record (the other rank's record written or not).  On the same disks
    # 15 loads when every rank's file of it is there (always, from the agreement on).  With rank
    # 1's disk lost (its files and record gone; resumed at 1 rank) 15 loads exactly when rank 0's
    # record says it is complete.
    cases = ['before-poll@1', 'before-poll@0', 'before-agreement@1', 'before-agreement@0',
             'before-record@0', 'after-record@0', 'before-record@1', 'after-record@1']
    loaded, lost = {}, {}
    for case in cases:
        path = tempfile.mkdtemp(prefix='bg-poll-kill-')
        try:
            _killed(case, path, 'poll')
            other = path + '.lost'
            shutil.copytree(path, other)
            loaded[case] = _resume(case, path, 2)
            for fn in os.listdir(other):   # rank 1's node-local disk is gone
                if fn.startswith('k.1.') or fn == '.k.1.complete':
                    os.unlink(os.path.join(other, fn))
            records = complete.read_records(other, 'k')
            want = 15 if any(it == 15 for _, it in records) else 10
            lost[case] = (_resume(case, other, 1, want), want)
        finally:
            shutil.rmtree(path, ignore_errors=True)
            shutil.rmtree(path + '.lost', ignore_errors=True)
    # From the agreement on, every rank's write of 15 was durable (at before-poll, the other
    # rank's may not be: the resume checks it loaded 15 exactly when every file of it is there).
    assert all(got == 15 for case, got in loaded.items() if 'poll' not in case), loaded
    assert all(got == want for got, want in lost.values()), lost
    # Not agreed yet: rank 0's record cannot list 15; agreed and recorded: it does.
    for case in ('before-poll@1', 'before-poll@0', 'before-agreement@1', 'before-agreement@0',
                 'before-record@0'):
        assert lost[case][0] == 10, lost
    assert lost['after-record@0'][0] == 15, lost


def _private_mounts():
    """Return why a private mount namespace with a tmpfs cannot be had here, or None."""
    if os.geteuid() != 0 or shutil.which('unshare') is None:
        return 'needs root and unshare(1)'
    probe = subprocess.run(['unshare', '-m', '--propagation', 'private', 'sh', '-c',
                            'mount -t tmpfs -o size=1m tmpfs /mnt'], capture_output=True, timeout=30)
    return None if probe.returncode == 0 else 'no private tmpfs mount: ' + probe.stderr.decode()[-200:]


def test_a_full_disk_fails_one_save_not_the_job():
    # A real ENOSPC: the snapshots go to a 4 MiB tmpfs, mounted in a private mount namespace that
    # mpiexec and both ranks share; the job fills it for the save of 10 (bg_disk_full_job.py).
    why = _private_mounts()
    if why is not None:
        pytest.skip(why)
    path = tempfile.mkdtemp(prefix='bg-full-')
    cmd = ['unshare', '-m', '--propagation', 'private', 'sh', '-c',
           'mount -t tmpfs -o size=4m,mode=700 tmpfs "$0" && exec "$@"', path,
           find_mpiexec(), '-n', '2', sys.executable, FULL_JOB, path]
    env = dict(os.environ, PYTHONUNBUFFERED='1', CHAINERMN_TIMEOUT='100')
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                            start_new_session=True, stdin=subprocess.DEVNULL)
    try:
        out, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
    finally:
        shutil.rmtree(path, ignore_errors=True)
    report = 'status {}\n{}\n{}'.format(proc.returncode, out.decode()[-3000:], err.decode()[-5000:])
    assert proc.returncode == 0, report
    assert out.decode().count('FULL OK rank') == 2, report
