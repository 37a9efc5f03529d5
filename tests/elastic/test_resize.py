"""Resume on another number of ranks (one host): killed at 4 ranks, resumed at 2, 6 and 3.

Every job runs under mpiexec with a hard timeout; the job kills itself mid-run (SIGKILL at a
chosen iteration), so nothing here waits on time.
"""

import collections
import glob
import json
import os
import shutil

import numpy
import pytest

from chainermn_comm.testing import run_mpi
from chainermn_train.checkpoint.read import npz as checkpoint_npz

HERE = os.path.dirname(os.path.abspath(__file__))
JOB = os.path.join(HERE, 'jobs', 'resize_job.py')
TIMEOUT = 400


def report(res):
    return 'status {} after {:.1f}s{}\n--- stdout ---\n{}\n--- stderr ---\n{}'.format(
        res.returncode, res.seconds, ' (TIMED OUT)' if res.timed_out else '',
        res.stdout[-6000:], res.stderr[-12000:])


def run_job(out, n, stop, kind, **env):
    env.setdefault('CHAINERMN_RANKS_PER_NODE', 2)
    return run_mpi([JOB, out, stop, kind], n, timeout=TIMEOUT, env=env)


def killed_run(out, kind, kill_at):
    res = run_job(out, 4, '1000i', kind, KILL_AT=kill_at, KILL_RANK=1, RUN=1)
    assert not res.timed_out and res.returncode != 0, report(res)
    assert 'done at iteration' not in res.stdout, report(res)
    return res


def resumed(out, n):
    return [json.load(open(os.path.join(out, 'resume.{}.json'.format(r)))) for r in range(n)]


def npz(path):
    with numpy.load(path) as f:
        return dict(f)


@pytest.mark.parametrize('n,lost_first_node', [(2, False), (6, False), (2, True)])
def test_resume_serial_iterator_on_another_number_of_ranks(tmp_path, n, lost_first_node):
    out = str(tmp_path)
    killed_run(out, 'serial', 22)
    if lost_first_node:   # node-local disks: the files of ranks 0 and 1 are gone with their node
        for fn in glob.glob(os.path.join(out, 'cp', 'job.[01].*')):
            os.remove(fn)
    ref = os.path.join(out, 'ref')
    shutil.copytree(os.path.join(out, 'cp'), ref)   # the snapshots as the killed job left them
    donor = os.path.join(ref, 'job.{}.20'.format(2 if lost_first_node else 0))
    assert os.path.exists(donor) and os.path.exists(os.path.join(ref, 'job.3.20'))
    values, _ = checkpoint_npz.read(donor)
    meta = checkpoint_npz.split_meta(values)
    assert meta['world_size'] == 4 and meta['ranks_per_node'] == 2 and meta['iteration'] == 20

    res = run_job(out, n, '40i', 'serial', CHAINERMN_RANKS_PER_NODE=min(n, 3), RUN=2)
    assert not res.timed_out and res.returncode == 0, report(res)
    assert 'loaded generation 20' in res.stderr, report(res)
    assert 'resharded from {}'.format(os.path.join(out, 'cp', os.path.basename(donor))) in res.stderr, report(res)
    states = resumed(out, n)
    for r, st in enumerate(states):
        assert st['loaded'] == 20 and st['iteration'] == 20 and st['size'] == n, st
        # the same fraction of the epoch, within one batch of the new shard
        assert abs(st['epoch_detail'] - meta['iterator/main/epoch_detail']) <= st['batch'] / st['length'], st
        assert st['epoch'] == meta['iterator/main/epoch'], st
        got = npz(os.path.join(out, 'resumed.{}.npz'.format(r)))
        for key, arr in got.items():
            want = values['updater/model:main/' + key[1:].replace('_', '/')]
            assert arr.dtype == want.dtype and numpy.array_equal(arr, want), (r, key)
    finals = [npz(os.path.join(out, 'final.{}.npz'.format(r))) for r in range(n)]
    for f in finals[1:]:
        assert all(numpy.array_equal(f[k], finals[0][k]) for k in f)
    assert res.stdout.count('done at iteration 40') == n, report(res)
    assert glob.glob(os.path.join(out, 'cp', 'job.*')) == []   # a finished run cleans up, old ranks too


def test_elastic_iterator_consumes_each_sample_of_the_epoch_once_across_a_resize(tmp_path):
    out = str(tmp_path)
    killed_run(out, 'elastic', 7)   # snapshot at iteration 5, mid-epoch (15 steps of 16 samples)
    res = run_job(out, 3, '1e', 'elastic', RUN=2)
    assert not res.timed_out and res.returncode == 0, report(res)
    assert all(st['loaded'] == 5 for st in resumed(out, 3))
    seen = []
    for fn in glob.glob(os.path.join(out, 'samples.*.log')):
        for line in open(fn):
            run, iteration, positions, ids = line.split()
            if run == '1' and int(iteration) > 5:
                continue   # redone after the resume from iteration 5
            seen += list(zip(map(int, positions.split(',')), map(int, ids.split(','))))
    n = 240
    positions = sorted(p for p, _ in seen)
    assert positions == list(range(len(positions))) and len(positions) >= n   # no gap, none twice
    epoch0 = collections.Counter(i for p, i in seen if p < n)
    assert sorted(epoch0) == list(range(n)) and set(epoch0.values()) == {1}
    assert len([1 for p, _ in seen if p < 80]) == 80   # 4 ranks x 4 samples x 5 iterations before


def _listing(cp):
    return sorted((fn, os.path.getsize(fn)) for fn in glob.glob(os.path.join(cp, '*')))


def test_unusable_snapshots_are_an_error_naming_each_generation_and_nothing_is_deleted(tmp_path):
    out = str(tmp_path)
    killed_run(out, 'serial', 12)   # generations 5 and 10 of 4 ranks
    cp = os.path.join(out, 'cp')
    before = _listing(cp)
    assert len(before) == 8

    # another model: readable files, wrong shapes
    res = run_job(out, 2, '40i', 'serial', RUN=2, JOB_HIDDEN=6)
    assert not res.timed_out and res.returncode != 0, report(res)
    assert 'SnapshotUnusableError' in res.stderr, report(res)
    assert 'no generation can be used by this job of 2 rank(s)' in res.stderr, report(res)
    for it in (10, 5):
        assert 'iteration {} (files of rank(s) 0,1,2,3; written by a job of world size 4)'.format(it) \
            in res.stderr, report(res)
    assert 'predictor/l1/W has shape (6, 4) but this job has (8, 4)' in res.stderr \
        or 'predictor/l1/W has shape (8, 4) but this job has (6, 4)' in res.stderr, report(res)
    assert 'start_fresh=True' in res.stderr and 'CHAINERMN_START_FRESH=1' in res.stderr, report(res)
    assert _listing(cp) == before

    # every file damaged
    for fn in glob.glob(os.path.join(cp, 'job.*')):
        with open(fn, 'r+b') as f:
            f.truncate(100)
    before = _listing(cp)
    res = run_job(out, 2, '40i', 'serial', RUN=3)
    assert not res.timed_out and res.returncode != 0, report(res)
    assert 'SnapshotUnusableError' in res.stderr and 'BadZipFile' in res.stderr, report(res)
    assert 'iteration 10 (files of rank(s) 0,1,2,3; written by a job of world size unknown' in res.stderr, \
        report(res)
    assert _listing(cp) == before

    res = run_job(out, 2, '3i', 'serial', RUN=4, CHAINERMN_START_FRESH=1)
    assert not res.timed_out and res.returncode == 0, report(res)
    assert 'starting from iteration 0 as asked' in res.stderr, report(res)
    assert all(st['loaded'] is None and st['iteration'] == 0 for st in resumed(out, 2))


def test_multi_node_iterator_keeps_the_masters_position(tmp_path):
    out = str(tmp_path)
    killed_run(out, 'multinode', 12)
    values, _ = checkpoint_npz.read(os.path.join(out, 'cp', 'job.0.10'))
    meta = checkpoint_npz.split_meta(values)
    res = run_job(out, 2, '20i', 'multinode', RUN=2)
    assert not res.timed_out and res.returncode == 0, report(res)
    for st in resumed(out, 2):
        assert st['loaded'] == 10 and st['epoch_detail'] == meta['iterator/main/epoch_detail'], st
    assert res.stdout.count('done at iteration 20') == 2, report(res)
