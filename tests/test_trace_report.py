"""A real trace read by the report: `CHAINERMN_TRACE` on a training loop, then `python -m chainermn trace`.

The recorder (chainermn-comm, -train) and the report (chainermn-tools) meet only in the files of
docs/trace.md; this runs both at 1, 2 and 3 ranks, with a rank slowed in its data path and without.
"""

import os
import re
import socket
import subprocess
import sys

import pytest

from chainermn_comm.testing import run_mpi

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, 'packages', 'chainermn-train', 'tests', 'mpi', 'trace_train.py')
STRAGGLER = re.compile(r'^straggler: rank (\d+) \((\S+)\) arrives ([0-9.]+) ms after the median at '
                       r'(\d+) of (\d+) updates; its extra time is in (\w+)', re.M)
LIVE = re.compile(r'^chainermn: straggler: rank (\d+) ', re.M)


def _train(tmp_path, n, *args):
    trace = tmp_path / 'trace'
    res = run_mpi([SCRIPT, str(tmp_path / 'out'), 40] + list(args), n, timeout=240,
                  env={'CHAINERMN_TRACE': str(trace)})
    report = 'status {} after {:.1f}s{}\n--- stdout ---\n{}\n--- stderr ---\n{}'.format(
        res.returncode, res.seconds, ' (TIMED OUT)' if res.timed_out else '', res.stdout[-4000:],
        res.stderr[-8000:])
    assert not res.timed_out and res.returncode == 0, report
    return trace, res


def _report(trace):
    res = subprocess.run([sys.executable, '-m', 'chainermn', 'trace', str(trace)],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120)
    out = res.stdout.decode(errors='replace')
    assert res.returncode == 0, out
    return out


def _rows(out):
    """Return {rank: median iteration ms} from the report's table."""
    rows = {}
    for line in out.splitlines():
        m = re.match(r'^(\d+)\s+\S+\s+median\s+([0-9.]+)\s', line)
        if m:
            rows[int(m.group(1))] = float(m.group(2))
    return rows


@pytest.mark.parametrize('n', [2, 3])
def test_a_rank_slowed_in_its_data_path_is_named_live_and_by_the_report(n, tmp_path):
    trace, res = _train(tmp_path, n, '--slow-rank', '1', '--sleep', '0.03')
    assert LIVE.findall(res.stderr) == ['1'], res.stderr[-4000:]
    out = _report(trace)
    found = STRAGGLER.findall(out)
    assert len(found) == 1, out
    rank, host, late, count, total, category = found[0]
    assert (rank, host, category) == ('1', socket.gethostname(), 'data'), out
    assert float(late) >= 15 and int(count) > int(total) // 2, out
    assert sorted(_rows(out)) == list(range(n)), out
    png = trace / 'trace.png'
    with open(str(png), 'rb') as f:
        assert f.read(8) == b'\x89PNG\r\n\x1a\n'
    assert png.stat().st_size > 20000


@pytest.mark.parametrize('n', [1, 2, 3])
def test_a_balanced_run_names_nobody(n, tmp_path):
    # Every rank fetches its batches in 20 ms: without it an iteration of this tiny model takes
    # 1-4 ms, and a rank that the scheduler serves a little later each time (two or three ranks
    # on two cores) is late by 20% of that.
    trace, res = _train(tmp_path, n, '--all-sleep', '0.02')
    assert not LIVE.search(res.stderr), res.stderr[-4000:]
    out = _report(trace)
    expected = 'stragglers: none' if n > 1 else 'stragglers: not measurable with one rank'
    assert not STRAGGLER.search(out) and expected in out, out
    rows = _rows(out)
    assert sorted(rows) == list(range(n)) and all(v > 0 for v in rows.values()), out
    assert (trace / 'trace.png').stat().st_size > 20000
