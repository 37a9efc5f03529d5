"""Drive the per-rank test files and the fault test under mpiexec."""

import os
import random
import re

import numpy
import pytest

from chainermn_comm.testing import run_mpi, run_pytest_under_mpi

HERE = os.path.dirname(__file__)


@pytest.mark.parametrize('n', [1, 2, 3])
def test_optimizer(n):
    run_pytest_under_mpi(os.path.join(HERE, 'mpi', 'mpi_optimizer.py'), n, timeout=240)


def test_optimizer_two_simulated_nodes():
    """Four ranks as two nodes of two: node-shared memory, then float16 (or float32) across nodes."""
    run_pytest_under_mpi(os.path.join(HERE, 'mpi', 'mpi_optimizer.py'), 4, timeout=240,
                         env={'CHAINERMN_RANKS_PER_NODE': '2'})


@pytest.mark.parametrize('n', [1, 2, 3])
def test_extensions(n):
    run_pytest_under_mpi(os.path.join(HERE, 'mpi', 'mpi_extensions.py'), n, timeout=240)


def _finals(out, n):
    res = []
    for r in range(n):
        with numpy.load(os.path.join(out, 'final.{}.npz'.format(r))) as f:
            res.append({k: f[k] for k in f.files})
    return res


def test_fault_sigkill_and_resume(tmp_path):
    script = os.path.join(HERE, 'mpi', 'fault_train.py')
    iters = 14
    rng = random.Random()
    kill_at = rng.randint(3, iters - 2)
    kill_rank = rng.randint(0, 1)
    what = 'kill_at={} kill_rank={}'.format(kill_at, kill_rank)

    ref_out = str(tmp_path / 'ref')
    ref = run_mpi([script, ref_out, iters], 2, timeout=180)
    assert ref.returncode == 0 and not ref.timed_out, ref.stderr[-5000:]

    out = str(tmp_path / 'run')
    crashed = run_mpi([script, out, iters], 2, timeout=180,
                      env={'KILL_AT': kill_at, 'KILL_RANK': kill_rank})
    assert crashed.returncode != 0 and not crashed.timed_out, what + crashed.stderr[-5000:]
    assert not os.path.exists(os.path.join(out, 'final.0.npz')), what
    resumed = run_mpi([script, out, iters], 2, timeout=180)
    assert resumed.returncode == 0 and not resumed.timed_out, what + resumed.stderr[-5000:]
    # Checkpoints every 2 iterations, written in the background: the one saved at the kill's
    # iteration (or the one before) may still be in flight when the rank dies, and is then not
    # complete; the one before it is (the next save waits for the write in flight).
    saved = kill_at - kill_at % 2
    expect = {saved, saved - 2} if saved - 2 > 0 else {saved, None}
    # the ranks share one unbuffered pipe: a line's newline may follow the other rank's words
    assert any(re.search(r'rank 0 resumed-from {}(\n|rank|$)'.format(e), resumed.stdout) for e in expect), \
        what + resumed.stdout
    assert 'files-left []' in resumed.stdout, resumed.stdout
    want, got = _finals(ref_out, 2), _finals(out, 2)
    for r in range(2):
        for k in want[r]:
            assert numpy.array_equal(want[r][k], got[r][k]), '{} rank {} param {}'.format(what, r, k)
    # The completed run removed the snapshots and the folder the killed run's checkpointer made.
    assert not os.path.exists(os.path.join(out, 'cp')), os.listdir(os.path.join(out, 'cp'))
