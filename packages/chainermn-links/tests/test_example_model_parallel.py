import os
import re

from chainermn_comm.testing import run_mpi

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), '..', '..', '..'))
SCRIPT = os.path.join(ROOT, 'examples', 'model_parallel', 'train_model_parallel.py')


def test_model_parallel_example_trains():
    res = run_mpi([SCRIPT, '--epoch', '3', '--batchsize', '32', '--unit', '64'], 2,
                  timeout=180, env={'CHAINERMN_TIMEOUT': '60'})
    assert not res.timed_out, res
    assert res.returncode == 0, res
    rows = re.findall(r'epoch (\d+) main/loss ([\d.]+) main/accuracy ([\d.]+) '
                      r'validation/main/loss ([\d.]+) validation/main/accuracy ([\d.]+)', res.stdout)
    assert [int(r[0]) for r in rows] == [1, 2, 3], res.stdout
    losses = [float(r[1]) for r in rows]
    accs = [float(r[4]) for r in rows]
    assert losses[-1] < losses[0]
    assert 0.5 < accs[-1] <= 1.0, accs       # 10 classes: chance is 0.1


def test_model_parallel_example_needs_two_ranks():
    res = run_mpi([SCRIPT, '--epoch', '1'], 1, timeout=120)
    assert res.returncode == 2
    assert 'exactly 2 processes' in res.stderr
