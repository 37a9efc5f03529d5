"""Smoke test of bench/check_cost.py: it runs at 2 ranks and reports both sides of every case."""

import json
import os

from chainermn_comm.testing import run_mpi

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_check_cost_bench_runs(tmp_path):
    out = tmp_path / 'cost.json'
    res = run_mpi([os.path.join(ROOT, 'bench', 'check_cost.py'), '--size', 'tiny', '--rounds', '2',
                   '--warmup', '0', '--small-calls', '5', '--out', out], 2, timeout=300)
    assert res.returncode == 0, res
    data = json.loads(out.read_text())
    assert data['ranks'] == 2
    assert set(data['cases']) == {'allreduce_1float', 'mean_grad_resnet50', 'mean_grad_mlp'}
    for c in data['cases'].values():
        assert len(c['checked_all_s']) == len(c['unchecked_all_s']) == 2
        assert c['checked_s'] > 0 and c['unchecked_s'] > 0
    assert 'allreduce_1float' in res.stdout and 'ratio' in res.stdout, res.stdout
