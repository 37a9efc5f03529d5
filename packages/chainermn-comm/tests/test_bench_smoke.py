"""Smoke test of the benchmark suite at tiny sizes (no timing assertions)."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), '..', '..', '..'))
pytestmark = pytest.mark.skipif(not os.path.isfile(os.path.join(ROOT, 'bench', 'run.sh')),
                                reason='bench/ lives in the monorepo checkout, not in an installed package')
CONTENDERS = ['ours_naive_multi_node_mean_grad', 'floor_packed_one', 'floor_packed_chunked',
              'per_array_allreduce', 'per_array_allreduce_mean', 'memcopy_once',
              'peer_chainer781_naive_mean_grad', 'peerjob_floor_packed_chunked',
              'peerjob_per_array_allreduce']


def test_bench_run_tiny(tmp_path):
    out = tmp_path / 'bench.json'
    env = dict(os.environ, PYTHON=sys.executable)
    res = subprocess.run(['bash', os.path.join(ROOT, 'bench', 'run.sh'), '--size', 'tiny', '-n', '2',
                          '--rounds', '2', '--out', str(out)], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300, start_new_session=True)
    assert res.returncode == 0, res.stdout + res.stderr
    data = json.loads(out.read_text())
    assert data['meta']['ours']['n'] == 2 and data['meta']['peer']['mode'] == 'peer'
    for when in ('before', 'after'):  # the machine-state probe: two ranks share this node
        p = data['meta']['ours']['cross_core_read_' + when]
        assert p['hot_us'] > 0 and p['local_us'] > 0 and p['ratio'] == p['hot_us'] / p['local_us']
    assert 'machine state: reading 512 KiB another core just wrote' in res.stdout
    assert data['meta']['peer']['peer_module'].endswith(os.path.join('site-packages', 'chainermn',
                                                                      '__init__.py'))
    for model in ('resnet50', 'mlp'):
        entry = data['models'][model]
        assert entry['bytes'] > 0 and entry['arrays'] > 0
        for name in CONTENDERS:
            c = entry['contenders'][name]
            assert len(c['times_s']) == 2
            assert c['median_s'] > 0 and c['min_s'] > 0 and c['algbw_GBps'] > 0 and c['busbw_GBps'] > 0
        assert entry['ratios']['ours_over_floor_chunked (target <= 1.15)'] > 0
        assert entry['ratios']['per_array_over_ours (target >= 1.4)'] > 0


def test_iteration_bench_tiny(tmp_path):
    out = tmp_path / 'iter.json'
    res = subprocess.run([sys.executable, os.path.join(ROOT, 'bench', 'iteration.py'), '--size', 'tiny',
                          '--ranks', '1,2', '--iters', '2', '--out', str(out)], cwd=ROOT,
                         capture_output=True, text=True, timeout=300, start_new_session=True)
    assert res.returncode == 0, res.stdout + res.stderr
    data = json.loads(out.read_text())
    for key in ('mlp@1', 'mlp@2', 'resnet@1', 'resnet@2'):
        e = data[key]
        for f in ('iteration_plain_s', 'iteration_overlap_s', 'compute_s', 'pack_unpack_s'):
            assert e[f] > 0, (key, f, e)
        assert 'exposed_comm_plain_s' in e and 'exposed_comm_overlap_s' in e
