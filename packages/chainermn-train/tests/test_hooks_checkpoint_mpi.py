"""PowerSGD's state in checkpoints: a killed job resumes with the same error feedback (bit for bit),
and a job resumed on another number of ranks starts every rank from the mean of the old memories."""

import glob
import os
import shutil

import numpy

from chainermn_comm.testing import run_mpi

HERE = os.path.dirname(os.path.abspath(__file__))
JOB = os.path.join(HERE, 'mpi', 'hook_resume_job.py')
STOP = 14


def _report(res):
    return 'status {} after {:.1f}s{}\n--- stdout ---\n{}\n--- stderr ---\n{}'.format(
        res.returncode, res.seconds, ' (TIMED OUT)' if res.timed_out else '',
        res.stdout[-4000:], res.stderr[-8000:])


def _run(out, n, **env):
    return run_mpi([JOB, out, STOP], n, timeout=240, env={k: str(v) for k, v in env.items()})


def _npz(path):
    with numpy.load(path) as f:
        return dict(f)


def _errors(values, prefix):
    """Return {name: error memory} from the flat arrays of a PowerSGD snapshot under ``prefix``."""
    names = [str(n) for n in values[prefix + 'error_names']]
    flat = values[prefix + 'rank_mean/error']
    out, off = {}, 0
    for name, (n, m) in zip(names, values[prefix + 'error_shapes']):
        out[name] = flat[off:off + n * m].reshape(n, m)
        off += n * m
    return out


def test_kill_resume_and_reshard_keep_the_error_feedback(tmp_path):
    ref, killed = str(tmp_path / 'ref'), str(tmp_path / 'killed')
    os.makedirs(ref)
    os.makedirs(killed)
    res = _run(ref, 2)
    assert res.returncode == 0 and not res.timed_out, _report(res)
    res = _run(killed, 2, KILL_AT=10)  # snapshots at 4 and 8; rank 1 dies after 10
    assert res.returncode != 0 and not res.timed_out, _report(res)
    assert sorted(os.path.basename(p) for p in glob.glob(os.path.join(killed, 'cp', 'job.*.8'))) == \
        ['job.0.8', 'job.1.8']
    reshard = str(tmp_path / 'reshard')
    shutil.copytree(killed, reshard)

    # Same world size: each rank loads its own file and ends with the uninterrupted run's bits.
    res = _run(killed, 2)
    assert res.returncode == 0 and not res.timed_out, _report(res)
    for r in range(2):
        loaded = _npz(os.path.join(killed, 'loaded.{}.npz'.format(r)))
        assert int(loaded['loaded']) == 8 and int(loaded['hook/updates']) == 8
        want, got = _npz(os.path.join(ref, 'final.{}.npz'.format(r))), \
            _npz(os.path.join(killed, 'final.{}.npz'.format(r)))
        assert sorted(want) == sorted(got)
        for k in want:
            assert want[k].tobytes() == got[k].tobytes(), (r, k)
        assert numpy.abs(got['hook/rank_mean/error']).max() > 0

    # Three ranks from the two ranks' snapshot: every rank starts from the mean of the memories.
    files = [_npz(os.path.join(reshard, 'cp', 'job.{}.8'.format(r))) for r in range(2)]
    prefix = 'updater/optimizer:main/comm_hook/'
    old = [_errors(f, prefix) for f in files]
    res = _run(reshard, 3)
    assert res.returncode == 0 and not res.timed_out, _report(res)
    for r in range(3):
        loaded = _npz(os.path.join(reshard, 'loaded.{}.npz'.format(r)))
        assert int(loaded['loaded']) == 8 and int(loaded['hook/updates']) == 8
        errors = _errors(loaded, 'hook/')
        assert sorted(errors) == sorted(old[0]) == ['/predictor/l1/W']  # l2/W (3 x 16) is too small
        for name, e in errors.items():
            numpy.testing.assert_allclose(e, (old[0][name] + old[1][name]) / 2, rtol=1e-6, atol=1e-7)
            assert not numpy.array_equal(old[0][name], old[1][name])
        assert loaded['hook/q'].tobytes() == files[0][prefix + 'q'].tobytes()  # the same on every rank
    finals = [_npz(os.path.join(reshard, 'final.{}.npz'.format(r))) for r in range(3)]
    for f in finals[1:]:
        for k in f:
            if k.startswith('param'):
                assert f[k].tobytes() == finals[0][k].tobytes(), k
