"""The model-parallel user scripts across 2 nodes: the pair on 2x1, data + model parallel on 2x2."""

import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CLI = [sys.executable, '-m', 'chainermn', 'cluster']
FINAL = re.compile(r'FINAL validation/main/accuracy=([0-9.]+)')


def _accuracy(args, ranks_per_node, timeout):
    res = subprocess.run(CLI + ['--nodes', '2', '--ranks-per-node', str(ranks_per_node),
                                '--timeout', str(timeout - 30), '--'] + args,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=timeout,
                         cwd=ROOT, stdin=subprocess.DEVNULL)
    report = 'status {}\n--- stdout ---\n{}\n--- stderr ---\n{}'.format(
        res.returncode, res.stdout[-6000:], res.stderr[-6000:])
    assert res.returncode == 0, report
    found = FINAL.findall(res.stdout)
    assert len(found) == 1, report
    return float(found[0]), report


def test_model_parallel_pair_across_two_nodes():
    """Rank 0 (node0) and rank 1 (node1) hold the two halves of the model; activations cross the link."""
    acc, report = _accuracy(['python', 'tests/model_parallel/mp_two_ranks.py', '--epoch', '2',
                             '--seed', '0'], 1, timeout=400)
    assert 0.95 < acc <= 1.0, report


def test_data_and_model_parallel_across_two_nodes():
    """Model pairs inside a node, gradients averaged across the nodes (data_comm spans both)."""
    acc, report = _accuracy(['python', 'examples/model_parallel/train_data_model_parallel.py',
                             '--epoch', '4', '--seed', '0', '--no-progress'], 2, timeout=500)
    assert 0.95 < acc <= 1.0, report
