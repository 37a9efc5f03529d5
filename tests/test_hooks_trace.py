"""A communication hook in a trace: PowerSGD's compute and bytes are recorded and reported apart.

Runs the training loop of packages/chainermn-train/tests/mpi/trace_train.py with
``comm_hook=PowerSGD(rank=1)`` under ``CHAINERMN_TRACE``, then ``python -m chainermn trace``.
"""

import collections
import json
import os
import re
import subprocess
import sys

import pytest

from chainermn_comm.testing import run_mpi

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, 'packages', 'chainermn-train', 'tests', 'mpi', 'trace_train.py')
HOOK = re.compile(r'^comm hook powersgd-r1: (\d+) rank-iterations; gradient ([0-9.e-]+) MB per iteration; '
                  r'hook compute ([0-9.]+) ms \(powersgd compress [0-9.]+, powersgd decompress [0-9.]+, '
                  r'powersgd orthogonalize [0-9.]+\); its all-reduces ([0-9.]+) ms, ([0-9.e-]+) MB '
                  r'\(([0-9.]+)% of the gradient\)', re.M)


@pytest.mark.parametrize('overlap', [False, True])
def test_powersgd_compute_and_bytes_in_the_trace_report(tmp_path, overlap):
    trace = tmp_path / 'trace'
    iters = 12
    res = run_mpi([SCRIPT, str(tmp_path / 'out'), iters, '--powersgd'] + (['--overlap'] if overlap else []),
                  2, timeout=240, env={'CHAINERMN_TRACE': str(trace)})
    detail = 'status {}\n{}\n{}'.format(res.returncode, res.stdout[-3000:], res.stderr[-6000:])
    assert res.returncode == 0 and not res.timed_out, detail
    with open(str(trace / 'trace.json')) as f:
        events = [e for e in json.load(f)['traceEvents'] if e.get('ph') == 'X']
    for rank in range(2):
        count = collections.Counter((e['cat'], e['name']) for e in events if e['pid'] == rank)
        for name in ('powersgd compress', 'powersgd orthogonalize', 'powersgd decompress'):
            assert count[('compute', name)] == iters, count
        assert count[('comm', 'powersgd P')] == count[('comm', 'powersgd Q')] == iters, count
    wire = [e['args'] for e in events if e['name'] == 'powersgd Q']
    # The MLP 4-5-3 in float64: l1/W (5 x 4) is compressed, its Q (4 x 1) is 32 bytes a rank; l2/W
    # (3 x 5) would not be 2x smaller as factors: averaged exactly, with the biases, beside P.
    assert all(a['hook_wire'] and a['hook'] == 'powersgd-r1' and a['bytes'] == 32 for a in wire), wire[:2]
    out = subprocess.run([sys.executable, '-m', 'chainermn', 'trace', str(trace), '--no-png'],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120)
    text = out.stdout.decode(errors='replace')
    assert out.returncode == 0, text
    m = HOOK.search(text)
    assert m, text
    # The gradient: 4x5 + 5 + 5x3 + 3 float64 values = 344 bytes.
    assert int(m.group(1)) == 2 * iters and float(m.group(2)) == 344e-6, text
    assert float(m.group(3)) > 0 and float(m.group(4)) > 0 and float(m.group(6)) > 0
