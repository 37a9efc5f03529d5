"""shard_state=True with the checkpointer: same-N bitwise, other-N re-partitioned, sharded <-> unsharded.

Every resume is compared with an unsharded job resumed the same way (1e-6 relative).  The jobs
(mpi/shard_resume_job.py) run under mpiexec with hard timeouts; each launch runs several
trainings one after another, each in its own snapshot directory (copied here between launches).
"""

import glob
import json
import os
import shutil
import struct
import zipfile

import numpy
import pytest

from chainermn_comm.testing import run_mpi

HERE = os.path.dirname(os.path.abspath(__file__))
JOB = os.path.join(HERE, 'mpi', 'shard_resume_job.py')
TIMEOUT = 300


def launch(out, n, plan):
    res = run_mpi([JOB, out, ','.join(plan)], n, timeout=TIMEOUT,
                  env={'CHAINERMN_RANKS_PER_NODE': '2'})
    assert not res.timed_out and res.returncode == 0, (
        'status {} after {:.1f}s\n{}\n{}'.format(res.returncode, res.seconds, res.stdout[-4000:],
                                                 res.stderr[-8000:]))
    return res


def reports(out, tag):
    found = sorted(glob.glob(os.path.join(out, '{}.*.json'.format(tag))))
    got = [json.load(open(fn)) for fn in found]
    assert got, tag
    for r in got:
        assert 'error' not in r, r
    return got


def params(out, tag, rank=0):
    with numpy.load(os.path.join(out, '{}.{}.npz'.format(tag, rank))) as f:
        return dict(f)


def same_on_every_rank(out, tag):
    n = len(glob.glob(os.path.join(out, '{}.*.npz'.format(tag))))
    first = params(out, tag)
    for r in range(1, n):
        other = params(out, tag, r)
        assert all(numpy.array_equal(first[k], other[k]) for k in first), (tag, r)
    return first


def close(got, want, what):
    assert sorted(got) == sorted(want)
    for k in want:
        numpy.testing.assert_allclose(got[k], want[k], rtol=1e-6, atol=1e-7, err_msg='{} {}'.format(what, k))


def corrupt_member(path, key):
    """Flip one byte in the data of member ``key`` of the npz at ``path`` (its metadata stays readable)."""
    with zipfile.ZipFile(path) as zf:
        info = zf.getinfo(key + '.npy')
    with open(path, 'r+b') as f:
        f.seek(info.header_offset + 26)
        name_len, extra_len = struct.unpack('<HH', f.read(4))
        at = info.header_offset + 30 + name_len + extra_len + info.compress_size - 1
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 0xFF]))


def copy(out, src, *dsts):
    for d in dsts:
        shutil.copytree(os.path.join(out, src), os.path.join(out, d))


def check_loaded(out, tag, iteration, shard, mode_part):
    for r in reports(out, tag):
        assert r['loaded'] == iteration and r['loaded_t'] == iteration, r
        # each rule's step count (Adam's bias correction): of every rule, or of the rank's share
        counted = r['owned'] if shard else list(r['loaded_rule_t'])
        assert {r['loaded_rule_t'][n] for n in counted} == {iteration}, r
        assert mode_part in r['mode'], r
        if shard:   # only the new share's state, before and after the updates
            assert r['with_state'] == r['owned'] == r['state_after'], r
        else:
            assert len(r['with_state']) == 6, r


@pytest.mark.slow
def test_sharded_state_resumes_on_any_number_of_ranks(tmp_path):
    out = str(tmp_path)
    launch(out, 2, ['a:A:1:10', 'b:B:0:10', 's:S:1:20'])
    launch(out, 4, ['a4:A4:1:10', 'b4:B4:0:10'])
    copy(out, 'A', 'A2', 'A2u', 'A3s', 'A3u')
    copy(out, 'B', 'B2', 'B2b', 'B3s', 'B3u')
    copy(out, 'A4', 'A42s', 'A42u', 'A4lost10', 'A4lostall', 'A4corrupt10')
    copy(out, 'B4', 'B42')
    os.remove(os.path.join(out, 'A4lost10', 'job.3.10'))   # a node-local disk gone
    for fn in glob.glob(os.path.join(out, 'A4lostall', 'job.3.*')):
        os.remove(fn)
    lost_all = sorted(os.listdir(os.path.join(out, 'A4lostall')))
    # a share damaged where only gathering reads it (rank 3 owned l1/b at 4 ranks)
    corrupt_member(os.path.join(out, 'A4corrupt10', 'job.3.10'), 'updater/optimizer:main/predictor/l1/b/m')

    res = launch(out, 2, ['r:A2:1:20', 'rb:B2:1:20', 'ru:A2u:0:20', 'rbb:B2b:0:20',
                          'f1:A42s:1:20', 'f2:A42u:0:20', 'f3:B42:0:20',
                          'l1:A4lost10:1:20', 'l2:A4lostall:1:20', 'c1:A4corrupt10:1:20'])
    # same N, sharded: each rank's own file, bit for bit as the run that never stopped
    check_loaded(out, 'r', 10, True, 'same world size, own files, run')
    assert 'gathered' not in reports(out, 'r')[0]['mode']
    straight = same_on_every_rank(out, 's')
    resumed = same_on_every_rank(out, 'r')
    assert all(numpy.array_equal(resumed[k], straight[k]) for k in straight)
    # same N, unsharded <-> sharded, against the unsharded job resumed the same way
    ref = same_on_every_rank(out, 'rbb')
    check_loaded(out, 'rb', 10, True, 'same world size, own files')
    close(same_on_every_rank(out, 'rb'), ref, 'unsharded snapshot, sharded job')
    check_loaded(out, 'ru', 10, False, 'sharded optimizer state gathered from 2 file(s)')
    close(same_on_every_rank(out, 'ru'), ref, 'sharded snapshot, unsharded job')
    # 4 -> 2
    ref = same_on_every_rank(out, 'f3')
    check_loaded(out, 'f1', 10, True, 'sharded optimizer state gathered from 4 file(s)')
    close(same_on_every_rank(out, 'f1'), ref, '4 -> 2 sharded')
    check_loaded(out, 'f2', 10, False, 'sharded optimizer state gathered from 4 file(s)')
    close(same_on_every_rank(out, 'f2'), ref, '4 -> 2 sharded snapshot, unsharded job')
    # a share file gone: the older complete generation, the missing file named
    check_loaded(out, 'l1', 5, True, 'gathered from 4 file(s)')
    warned = ' '.join(reports(out, 'l1')[0]['warnings'])
    assert 'job.3.10' in warned and 'sharded optimizer state' in warned, warned
    # a share file that cannot be read when gathered: the older generation, the file named
    check_loaded(out, 'c1', 5, True, 'gathered from 4 file(s)')
    warned = ' '.join(reports(out, 'c1')[0]['warnings'])
    assert 'its share file {}'.format(os.path.join(out, 'A4corrupt10', 'job.3.10')) in warned, warned
    assert 'falling back to an older generation' in warned, warned
    # every share file of one rank gone: refused, naming them and what they held
    for r in json_all(out, 'l2'):
        assert r['error'].startswith('SnapshotUnusableError'), r
        for it in (5, 10):
            assert os.path.join(out, 'A4lostall', 'job.3.{}'.format(it)) in r['error'], r
        assert 'the optimizer state of' in r['error'] and 'main:predictor/' in r['error'], r
    after = sorted(os.listdir(os.path.join(out, "A4lostall")))
    assert after == lost_all, (after, lost_all)   # nothing deleted

    # 2 -> 3, every combination against the unsharded job resumed the same way
    launch(out, 3, ['aa:A3s:1:20', 'au:A3u:0:20', 'ba:B3s:1:20', 'bb:B3u:0:20'])
    ref = same_on_every_rank(out, 'bb')
    check_loaded(out, 'aa', 10, True, 'resharded from')
    close(same_on_every_rank(out, 'aa'), ref, '2 -> 3 sharded')
    check_loaded(out, 'au', 10, False, 'gathered from 2 file(s)')
    close(same_on_every_rank(out, 'au'), ref, '2 -> 3 sharded snapshot, unsharded job')
    check_loaded(out, 'ba', 10, True, 'resharded from')
    close(same_on_every_rank(out, 'ba'), ref, '2 -> 3 unsharded snapshot, sharded job')

    # 3 -> 1 (the generations of iteration 20 written at 3 ranks, sharded and not)
    copy(out, 'A3s', 'A1s', 'A1u')
    copy(out, 'B3u', 'B1u', 'B1s')
    launch(out, 1, ['x:A1s:1:25', 'y:A1u:0:25', 'z:B1u:0:25', 'w:B1s:1:25'])
    ref = params(out, 'z')
    check_loaded(out, 'x', 20, True, 'gathered from 3 file(s)')
    close(params(out, 'x'), ref, '3 -> 1 sharded')
    check_loaded(out, 'y', 20, False, 'gathered from 3 file(s)')
    close(params(out, 'y'), ref, '3 -> 1 sharded snapshot, unsharded job')
    check_loaded(out, 'w', 20, True, 'resharded from')
    close(params(out, 'w'), ref, '3 -> 1 unsharded snapshot, sharded job')


def json_all(out, tag):
    return [json.load(open(fn)) for fn in sorted(glob.glob(os.path.join(out, '{}.*.json'.format(tag))))]
