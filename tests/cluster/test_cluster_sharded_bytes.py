"""Sharded optimizer state across 2 namespace nodes: the bytes on each node's link equal the all-reduce's.

Issue 52: a reduce-scatter to the owners and an all-gather from them move the bytes of one
all-reduce.  Runs ``bench/sharded_state.py --cluster none`` (2 nodes x 1 and x 2 ranks, Adam on the
784-1000-1000-10 MLP's 7.2 MB of float32 gradient) with a hard timeout and asserts on the bytes each
node's eth0 carried per update (sent plus received, counted between barriers), not on time.  With
two ranks per node each node's sum crosses the link once (node-shared memory inside the node).
"""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), '..', '..'))
BENCH = os.path.join(ROOT, 'bench', 'sharded_state.py')


@pytest.fixture(autouse=True)
def _real_nodes(monkeypatch):
    monkeypatch.delenv('CHAINERMN_RANKS_PER_NODE', raising=False)


@pytest.mark.parametrize('per_node', [1, 2])
def test_sharded_update_moves_the_bytes_of_one_allreduce(require_cluster, record_figure, per_node):
    cmd = [sys.executable, BENCH, '--cluster', 'none', '--ranks-per-node', str(per_node), '--model', 'mlp',
           '--warmup', '2', '--updates', '3', '--repeats', '1', '--timeout', '240', '--json']
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=420, start_new_session=True)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    (row,) = [json.loads(line) for line in res.stdout.splitlines() if line.startswith('{')]
    assert row['ranks'] == 2 * per_node and row['cluster'] == '2x{}'.format(per_node)
    assert row['shares_through_node_shared_memory'] is (per_node > 1)
    grad = row['grad_bytes']
    assert grad == 4 * (784 * 1000 + 1000 + 1000 * 1000 + 1000 + 1000 * 10 + 10)
    for full, shard in zip(row['link_bytes_unsharded'], row['link_bytes_sharded']):
        # Each node sends its half of the gradient and receives the other's, both ways (plus headers).
        assert 2 * grad <= full < 2.25 * grad, row
        assert abs(shard - full) <= 0.02 * full, row
    record_figure('issue 52: sharded / unsharded bytes on eth0, 2x{}'.format(per_node), max(row['link_bytes_ratio']),
                  'ratio (bytes per update and node: sharded {} vs unsharded {})'.format(
                      row['link_bytes_sharded'], row['link_bytes_unsharded']))
