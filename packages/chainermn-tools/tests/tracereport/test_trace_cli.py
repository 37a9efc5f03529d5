"""``python -m chainermn trace DIR``: exit statuses, the printed report, and DIR/trace.png."""

import os
import struct
import subprocess
import sys

import pytest

import trace_synth
from chainermn_tools.trace import main

STRAGGLER = ('straggler: rank 2 (node1) arrives 15.0 ms after the median at 20 of 20 updates; its '
             'extra time is in data (+15.0 ms per iteration against the median rank)')


@pytest.fixture(autouse=True)
def no_comm_merge(monkeypatch):
    monkeypatch.setitem(sys.modules, 'chainermn_comm.trace', None)


def run(*args):
    # No comm merge in the child either: a trace.json written by it would not change the figures.
    return subprocess.run([sys.executable, '-m', 'chainermn', 'trace'] + list(args),
                          capture_output=True, text=True, timeout=120)


def png_size(path):
    """Return (width, height) from a PNG's IHDR chunk, after checking the signature."""
    with open(path, 'rb') as f:
        head = f.read(24)
    assert head[:8] == b'\x89PNG\r\n\x1a\n' and head[12:16] == b'IHDR', head
    return struct.unpack('>II', head[16:24])


def straggler_dir(tmp_path):
    trace_synth.write_parts(tmp_path, trace_synth.make(
        ranks=3, iterations=20, hosts=['node0', 'node0', 'node1'], slow_rank=2, slow=15.0,
        buckets=2, transfer=8.0))
    return str(tmp_path)


def test_command_prints_the_table_and_the_straggler_and_draws(tmp_path):
    pytest.importorskip('matplotlib')  # the dev set-up has it (bench/requirements.txt)
    res = run(straggler_dir(tmp_path))
    assert res.returncode == 0, res.stdout + res.stderr
    lines = res.stdout.splitlines()
    assert lines[1] == '3 rank(s) on 2 host(s), 20 updates per rank, median iteration 56.0 ms'
    head = next(i for i, ln in enumerate(lines) if ln.startswith('rank  host'))
    assert lines[head].split() == ['rank', 'host', 'iter', 'compute', 'comm', 'wait', 'data', 'io',
                                   'eval', 'other', 'hidden', 'grad', 'GB/s', 'best']
    rows = lines[head + 2:head + 8]
    assert rows[4].split()[:4] == ['2', 'node1', 'median', '56.0'], rows
    assert rows[4].split()[4:] == ['32.0', '4.0', '0.0', '20.0', '0.0', '0.0', '0.0', '50%', '0.52',
                                   '0.52'], rows
    # Rank 0 finishes backward 15 ms before rank 2 delivers its buckets: 11 ms of that it waits,
    # and both bucket transfers (4 ms each) run after its backward: exposed.
    assert rows[1].split() == ['p95', '56.0', '32.0', '8.0', '11.0', '5.0', '0.0', '0.0', '0.0']
    # The columns line up: every figure of a column ends where its heading ends.
    ends = [lines[head].index(h) + len(h) for h in ('iter', 'compute', 'hidden', 'best')]
    for row in rows[::2]:
        assert all(row[e - 1] != ' ' and (e == len(row) or row[e] == ' ') for e in ends), row
    assert STRAGGLER in lines
    png = os.path.join(str(tmp_path), 'trace.png')
    assert lines[-1] == 'wrote ' + png
    width, height = png_size(png)
    assert 900 <= width <= 2400 and 500 <= height <= 2400, (width, height)
    assert os.path.getsize(png) > 20000


def test_balanced_names_nobody(tmp_path):
    trace_synth.write_merged(tmp_path, trace_synth.make(ranks=2, iterations=10))
    assert main([str(tmp_path / 'trace.json'), '--no-png']) == 0
    assert not (tmp_path / 'trace.png').exists()


def test_no_trace_is_exit_2_naming_the_directory(tmp_path):
    res = run(str(tmp_path))
    assert res.returncode == 2 and res.stdout == '', res.stdout + res.stderr
    assert res.stderr.strip() == (
        'python -m chainermn trace: {0} holds no trace: neither trace.json nor part files '
        'trace.rank<R>.json (run the job with CHAINERMN_TRACE={0} to record one)'.format(tmp_path))
    res = run(str(tmp_path / 'missing'))
    assert res.returncode == 2 and 'missing does not exist' in res.stderr, res.stderr


def test_without_matplotlib_the_text_report_still_comes(tmp_path, monkeypatch, capsys):
    for name in [m for m in sys.modules if m == 'matplotlib' or m.startswith('matplotlib.')]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, 'matplotlib', None)
    assert main([straggler_dir(tmp_path), '--png', str(tmp_path / 'x.png')]) == 0
    out = capsys.readouterr().out
    assert STRAGGLER in out.splitlines()
    assert 'no picture: matplotlib is not installed' in out and 'chainermn[plot]' in out
    assert not (tmp_path / 'x.png').exists()


def test_picture_of_many_ranks_and_threads(tmp_path):
    pytest.importorskip('matplotlib')
    trace_synth.write_parts(tmp_path, trace_synth.make(ranks=12, iterations=6, buckets=2,
                                                       slow_rank=5, slow=30.0, slow_in='backward'))
    png = str(tmp_path / 'many.png')
    assert main([str(tmp_path), '--png', png, '--iterations', '2']) == 0
    width, height = png_size(png)
    assert 1400 <= width <= 2400 and 1000 <= height <= 3000, (width, height)


def test_usage_names_the_command():
    from chainermn_tools.cli import COMMANDS, USAGE
    assert COMMANDS['trace'] == 'chainermn_tools.trace'
    assert '  trace    report where the time of a run recorded with CHAINERMN_TRACE=DIR went' in USAGE
