"""Background checkpoint writes: the per-rank tests at 1-3 ranks, and the kill points at 2 ranks."""

import os
import re
import shutil
import tempfile

import pytest

from chainermn_comm.testing import run_mpi, run_pytest_under_mpi

from chainermn_train.checkpoint._background import KILL_POINTS

HERE = os.path.dirname(__file__)
JOB = os.path.join(HERE, 'mpi', 'bg_kill_job.py')


@pytest.mark.parametrize('n', [1, 2, 3])
def test_background_checkpoint(n):
    run_pytest_under_mpi(os.path.join(HERE, 'mpi', 'mpi_background_checkpoint.py'), n, timeout=300)


def test_kill_at_every_point_of_a_background_save_resumes_from_the_newest_complete_generation():
    # Each point of a save (copy, write, fsync/rename, agreement, record) on rank 1, and the
    # write's points on rank 0: the job dies there; the next job loads exactly the newest
    # generation whose every file reached the disk (15 or 10), removes the rest, and its weights
    # are that generation's.
    cases = ['{}@1'.format(p) for p in KILL_POINTS] + ['{}@0'.format(p) for p in
                                                       ('mid-write', 'before-rename', 'after-rename')]
    loaded = {}
    for case in cases:
        path = tempfile.mkdtemp(prefix='bg-kill-')
        try:
            res = run_mpi([JOB, 'write', path, case], 2, timeout=90)
            report = '{}: status {}\n{}\n{}'.format(case, res.returncode, res.stdout[-3000:],
                                                    res.stderr[-3000:])
            assert not res.timed_out, report
            killed = 'DONE rank ' + case.split('@')[1]
            assert res.returncode != 0 and killed not in res.stdout, report   # it was killed
            res = run_mpi([JOB, 'resume', path], 2, timeout=90)
            report = '{} resume: status {}\n{}\n{}'.format(case, res.returncode, res.stdout[-3000:],
                                                           res.stderr[-5000:])
            assert res.returncode == 0, report
            got = sorted(re.findall(r'LOADED (\d+) rank (\d)', res.stdout))
            assert len(got) == 2 and got[0][0] == got[1][0], report
            loaded[case] = int(got[0][0])
        finally:
            shutil.rmtree(path, ignore_errors=True)
    # Killed before its own file of 15 existed: 15 is never loaded.
    for p in ('before-copy', 'after-copy', 'mid-write', 'before-rename'):
        assert loaded[p + '@1'] == 10, loaded
    # Killed after every rank's write finished (rank 1 waited for its own at the agreement, and
    # rank 0 for its own before it): 15 is complete and loaded.
    for p in ('before-record', 'after-record'):
        assert loaded[p + '@1'] == 15, loaded
