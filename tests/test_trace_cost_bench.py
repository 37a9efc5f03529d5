"""Smoke test of bench/trace_cost.py: every mode and the baseline run, ratios are reported."""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_trace_cost_bench_runs(tmp_path):
    out = tmp_path / 'cost.json'
    # The checkout itself as the baseline: the 'before' jobs run without switching anything.
    res = subprocess.run([sys.executable, os.path.join(ROOT, 'bench', 'trace_cost.py'), '--models',
                          'allreduce,mnist', '--size', 'tiny', '--rounds', '2', '--block', '2',
                          '--warmup', '1', '--baseline-src', ROOT, '--out', str(out)],
                         capture_output=True, text=True, timeout=300, start_new_session=True)
    assert res.returncode == 0, res.stdout + res.stderr
    data = json.loads(out.read_text())
    assert data['ranks'] == 2 and set(data['models']) == {'allreduce', 'mnist'}
    for entry in data['models'].values():
        assert set(entry['times_s']) == {'before', 'off', 'trace', 'nostraggler'}
        assert all(len(v) == 2 and min(v) > 0 for v in entry['times_s'].values())
        assert set(entry['ratios']) == {'trace/off', 'off/nostraggler', 'off/before'}
    assert 'trace/off' in res.stdout and 'mnist@2' in res.stdout, res.stdout
