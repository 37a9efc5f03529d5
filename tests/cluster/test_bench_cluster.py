"""Smoke test of bench/cluster.py at tiny sizes on a cluster of namespaces (no timing assertions)."""

import importlib.util
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), '..', '..'))
BENCH = os.path.join(ROOT, 'bench', 'cluster.py')
_spec = importlib.util.spec_from_file_location('chainermn_bench_cluster', BENCH)
bench_cluster = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_cluster)

OURS = ['ours_naive_multi_node_mean_grad', 'ours_naive_fp16_multi_node_mean_grad',
        'ours_naive_bf16_multi_node_mean_grad', 'ours_naive_auto_multi_node_mean_grad',
        'ours_fixed_float32', 'ours_fixed_float16', 'ours_fixed_bfloat16', 'per_array_allreduce',
        'floor_packed_chunked']
TUNED = ['ours_naive_multi_node_mean_grad', 'ours_naive_fp16_multi_node_mean_grad',
         'ours_naive_bf16_multi_node_mean_grad', 'ours_naive_auto_multi_node_mean_grad']
PEER = ['peer_chainer781_naive_mean_grad', 'peerjob_floor_packed_chunked']
GLOO = ['gloo_flat_allreduce', 'gloo_ddp_buckets25MB_allreduce']
ITER_OURS = ['plain', 'overlap', 'compute', 'allreduce', 'plain_fp16', 'overlap_fp16', 'allreduce_fp16',
             'plain_auto', 'overlap_auto']
ITER_PEER = ['peer_plain', 'peer_allreduce', 'compute']


def _torch():
    try:
        import torch.distributed  # noqa: F401
    except ImportError:
        return False
    return True


def test_link_bound_formula():
    # 2(N-1)/N x S / rate: 100 MB over 2 nodes at 1 Gbit/s is 100e6 bytes / 125e6 bytes/s.
    assert bench_cluster.link_bound(100e6, 2, 1.0) == pytest.approx(0.8)
    assert bench_cluster.link_bound(100e6, 4, 10.0) == pytest.approx(1.5 * 100e6 / 1.25e9)
    assert bench_cluster.link_bound(100e6, 2, 1.0, 0.5) == pytest.approx(0.4)
    assert bench_cluster.link_bound(100e6, 2, None) is None
    assert bench_cluster.link_bound(100e6, 1, 1.0) is None


def test_bench_cluster_tiny(tmp_path):
    # Skips (with what is missing) through tests/cluster/conftest.py where namespaces cannot be made.
    out = tmp_path / 'res'
    cmd = [sys.executable, BENCH, '--size', 'tiny', '--layouts', '2x1', '--links', '1', '--models', 'mlp',
           '--rounds', '2', '--warmup', '0', '--iters', '1', '--timeout', '240', '--out-dir', str(out)]
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600, start_new_session=True)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    data = json.loads((out / 'cluster.json').read_text())
    assert (out / 'cluster.png').read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'
    (row,) = data['allreduce']
    assert row['model'] == 'mlp' and row['layout'] == '2x1' and row['link_gbit'] == 1.0
    assert row['bytes'] == sum(4 * (a * b if b else a) for a, b in
                               ((48, 64), (48, 0), (48, 48), (48, 0), (10, 48), (10, 0)))
    assert row['bound_s'] == pytest.approx(row['bytes'] / 125e6)
    assert row['bound_fp16_s'] == pytest.approx(row['bound_s'] / 2)
    want = OURS + PEER + (GLOO if _torch() else [])
    assert sorted(row['contenders']) == sorted(want)
    peer = row['contenders']['peer_chainer781_naive_mean_grad']['median_s']
    for name in want:
        c = row['contenders'][name]
        assert len(c['times_s']) == 2 and all(t > 0 for t in c['times_s'])
        assert 0 < c['min_s'] <= c['median_s'] < 60
        assert c['ratio_to_bound'] == pytest.approx(c['median_s'] / row['bound_s'])
        assert c['ratio_to_peer'] == pytest.approx(c['median_s'] / peer)
    (it,) = data['iteration']
    assert sorted(it['ours']['median_s']) == sorted(ITER_OURS)
    assert sorted(it['peer']['median_s']) == sorted(ITER_PEER)
    assert all(0 < v < 60 for v in list(it['ours']['median_s'].values()) + list(it['peer']['median_s'].values()))
    assert it['exposed_s']['overlap'] == pytest.approx(it['ours']['median_s']['overlap']
                                                       - it['ours']['median_s']['compute'])
    assert it['speedup_over_peer']['best'] > 0
    for key in ('mlp 1G 2x1 ours/bound (<= 1.10)', 'mlp 1G 2x1 peer/fp16 (>= 1.8)',
                'iteration 1G 2x1 overlap/plain (<= 1)', 'iteration 1G 2x1 speedup over peer, best of ours'):
        assert data['targets'][key] > 0, key
    assert data['targets']['mlp unthrottled 2x1 ours/floor (<= 1.05)'] is None  # not measured in this run
    assert 'ours float16' in res.stdout and 'peer (Chainer 7.8.1 naive)' in res.stdout
    # 'auto' and bfloat16 beside the fixed choices: each tuning contender ran its schedule first.
    assert sorted(row['tuning']) == sorted(TUNED)
    for name, tn in row['tuning'].items():
        assert tn['calls'] == len(tn['times_s']) >= 2 and tn['seconds'] > 0, name
        assert tn['cost_updates'] is not None, name
    assert row['tuning']['ours_naive_auto_multi_node_mean_grad']['choice']['dtype'] in (
        'float32', 'float16', 'bfloat16')
    assert 'dtype' in row['tuning']['ours_naive_auto_multi_node_mean_grad']['figures_s']  # 2x1: a real wire
    assert row['auto_over_best_fixed'] > 0
    assert 0 <= row['precision']['ours_naive_bf16_multi_node_mean_grad']['rel_error_2norm'] <= 2.0 ** -8
    assert row['precision']['ours_naive_bf16_multi_node_mean_grad']['wire'] == 'bfloat16'
    for key in ('mlp 1 Gbit/s 2x1 auto/best fixed (<= 1.05)', 'mlp 1 Gbit/s 2x1 bf16/float32 bound (<= 0.55)',
                'mlp 1 Gbit/s 2x1 bf16 mean rel. error (<= 2**-8 = 0.0039)'):
        assert data['targets'][key] is not None, key
    assert 'ours auto' in res.stdout and 'ours bfloat16' in res.stdout and 'tuning of ours auto' in res.stdout
