"""The README's Quick start, assembled into a script, at 3 ranks: killed mid-run, then resumed.

The block is copied out of README.md unchanged (it trains on scikit-learn's bundled digits: no
download). Rank 0 gets its own ``--out`` folder and ranks 1 and 2 another one (an MPMD launch of
the same script), so the test sees who writes what: only rank 0 prints reports and progress and
writes ``log``, ``cg.dot`` and plots; every rank writes its own snapshots. The first run is
killed (SIGKILL to every process of the job) once a complete generation of snapshots is on disk;
the same command then resumes from a generation > 0 and ends at the configured iteration.  Its
whole output (stdout and stderr in the order written) holds one table with nothing inside it but
rows and the progress bar, each library line once, and the completed run leaves no empty folder.
"""

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from chainermn_comm import threads
from chainermn_comm.protocol import THREADS_ENV
from chainermn_comm.testing import find_mpiexec

from docs_support import block, run_in_session

pytestmark = pytest.mark.slow

EPOCHS = 20
PER_EPOCH = 5  # 1500 training digits over 3 ranks, batches of 100
LAST = EPOCHS * PER_EPOCH
FINAL = re.compile(r'^(?:\x1b\[\d*[AJ])*FINAL iteration=(\d+) validation/main/accuracy=([0-9.]+)$', re.M)
LOADED = re.compile(r"^(?:chainermn: \[rank 0 host [^\]]*\] )?chainermn checkpoint: loaded generation (\d+) of 'mnist' \((.*)\)$", re.M)
ROW = re.compile(r'^(?:\x1b\[\d*[AJ])*(\d+)\s+[0-9.]+\s', re.M)     # a PrintReport row starts with the epoch
BAR = re.compile(r'^\s+(\d+) iter, \d+ epoch / \d+ epochs$', re.M)  # a ProgressBar status line
ESCAPE = re.compile(r'\x1b\[\d*[AJ]')   # PrintReport and ProgressBar move the cursor and clear
#: What a line inside the table may be: a row, or a line of the progress bar.
TABLE_LINE = re.compile(r'^(\d+\s+[0-9.]+\s.*|\s*total \[[#.]*\].*|this epoch \[[#.]*\].*|'
                        r'\s+\d+ iter, \d+ epoch / \d+ epochs|\s*\S+ iters/sec\. Estimated time to finish: .*)$')


def _command(tmp_path):
    python = [sys.executable, str(tmp_path / 'train.py'), '--epoch', str(EPOCHS)]
    return ([find_mpiexec(), '-n', '1'] + python + ['--out', str(tmp_path / 'out0'), ':',
            '-n', '2'] + python + ['--out', str(tmp_path / 'out12')])


def _env():
    # The thread pools sized by chainermn's rule (so that rank 0 says so: one line, asserted).
    env = {k: v for k, v in os.environ.items() if k not in threads.POOL_VARIABLES + (THREADS_ENV,)}
    return dict(env, PYTHONUNBUFFERED='1', CHAINERMN_TIMEOUT='240')


def _generations(tmp_path):
    """Iterations for which all three ranks' snapshot files are on disk."""
    seen = {}
    for out in ('out0', 'out12'):
        folder = tmp_path / out / 'checkpoints'
        for name in (os.listdir(str(folder)) if folder.is_dir() else ()):
            m = re.match(r'^mnist\.(\d+)\.(\d+)$', name)
            if m:
                seen.setdefault(int(m.group(2)), set()).add(int(m.group(1)))
    return sorted(it for it, ranks in seen.items() if ranks == {0, 1, 2})


def _kill_after_first_generation(tmp_path, timeout=300):
    """Start the job, SIGKILL all of it once a complete generation exists; return its output."""
    with open(str(tmp_path / 'run1.out'), 'wb') as out, open(str(tmp_path / 'run1.err'), 'wb') as err:
        proc = subprocess.Popen(_command(tmp_path), stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                cwd=str(tmp_path), env=_env(), start_new_session=True)
        deadline = time.monotonic() + timeout
        try:
            while not _generations(tmp_path):
                assert proc.poll() is None, 'the job ended (status {}) before a snapshot existed'.format(
                    proc.returncode)
                assert time.monotonic() < deadline, 'no complete snapshot generation after {}s'.format(
                    timeout)
                time.sleep(0.05)  # polling the files, not waiting for an event to happen
            ended_early = proc.poll()
        finally:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    text = (tmp_path / 'run1.out').read_text(errors='replace') + (tmp_path / 'run1.err').read_text(
        errors='replace')
    assert ended_early is None, 'the job finished before it could be killed:\n' + text
    return text


def test_quickstart_reports_once_and_resumes_after_a_kill(tmp_path):
    (tmp_path / 'train.py').write_text(block('quickstart').text)

    first = _kill_after_first_generation(tmp_path)
    assert 'FINAL' not in first, first
    assert _generations(tmp_path), first

    # The whole output, stdout and stderr in the order they were written, as on a terminal.
    res = run_in_session(_command(tmp_path), timeout=600, cwd=str(tmp_path), env=_env(), merge=True)
    text = res.stdout
    report = 'status {} after {:.0f}s{}\n--- first run ---\n{}\n--- output ---\n{}'.format(
        res.returncode, res.seconds, ' (TIMED OUT)' if res.timed_out else '', first[-4000:],
        text[-12000:])
    assert not res.timed_out and res.returncode == 0, report

    # Resumed: rank 0 says once which generation all ranks loaded (each rank its own file).
    loaded = LOADED.findall(text)
    assert len(loaded) == 1, report
    generation = int(loaded[0][0])
    assert 0 < generation < LAST and generation % PER_EPOCH == 0, report
    assert loaded[0][1].startswith('same world size, own files'), report

    # ... and reached the configured end.
    final = FINAL.findall(text)
    assert len(final) == 1, report
    assert int(final[0][0]) == LAST, report
    assert float(final[0][1]) > 0.9, report

    # One report: the header once, each epoch once (Chainer 7.8.1's PrintReport prints the log
    # that LogReport got back from the snapshot again, from epoch 1).
    assert text.count('validation/main/accuracy') == 2, report  # the header and FINAL
    rows = [int(e) for e in ROW.findall(text)]
    assert rows in (list(range(1, EPOCHS + 1)),
                    list(range(generation // PER_EPOCH + 1, EPOCHS + 1))), (rows, report)
    # One progress bar: every 10th iteration after the resumed one, once each.
    bars = [int(i) for i in BAR.findall(text)]
    assert bars == [i for i in range(generation + 1, LAST + 1) if i % 10 == 0], (bars, report)

    # One voice: the table holds nothing but its rows and the progress bar, and each library
    # line is said once (by rank 0), before the table or after it.
    lines = [ESCAPE.sub('', line) for line in text.splitlines()]
    header = [i for i, line in enumerate(lines) if line.startswith('epoch') and 'main/loss' in line]
    assert len(header) == 1, report
    last_row = max(i for i, line in enumerate(lines) if ROW.match(line))
    foreign = [line for line in lines[header[0] + 1:last_row] if not TABLE_LINE.match(line)]
    assert foreign == [], (foreign, report)
    assert sum('CPUModeWarning' in line for line in lines) == 0, report   # quiet default (issue 54)
    # The thread pools (said at the communicator's creation, by rank 0 only): before the table.
    crowded = bool(threads.oversubscription([threads.local_facts()] * 3))   # 3 ranks on this machine
    for said, times in (('BLAS and OpenMP threads: ', 1), ('oversubscribed: ', int(crowded)),
                        ('loaded generation', 1)):
        at = [i for i, line in enumerate(lines) if said in line]
        assert len(at) == times and all(i < header[0] for i in at), (said, at, header, report)
        assert all(lines[i].startswith('chainermn: [rank 0 host ') for i in at), (said, report)
    assert sum('tuned at call' in line for line in lines) <= 1, report
    warned = [line for line in lines if 'Warning: ' in line]   # one line per warning shown
    assert len(warned) == len(set(warned)) and len(warned) <= 2, (warned, report)
    assert sum('took over the snapshots' in line for line in warned) <= 1, report   # the killed job's

    # Only rank 0 wrote files besides snapshots; the completed run removed every snapshot and
    # the checkpoint folder it made (out12, the trainer's out of ranks 1-2, stays: empty).
    assert os.listdir(str(tmp_path / 'out12')) == [], sorted(os.listdir(str(tmp_path / 'out12')))
    out0 = set(os.listdir(str(tmp_path / 'out0')))
    left = sorted(os.listdir(str(tmp_path / 'out0' / 'checkpoints'))) if 'checkpoints' in out0 else []
    assert {'log', 'cg.dot', 'loss.png'} <= out0 and 'checkpoints' not in out0, (out0, left, report)
    with open(str(tmp_path / 'out0' / 'log')) as f:
        log = json.load(f)
    assert [e['epoch'] for e in log] == list(range(1, EPOCHS + 1)), log
    assert log[-1]['iteration'] == LAST, log
