"""The README's Quick start, assembled into a script, at 3 ranks: killed mid-run, then resumed.

The block is copied out of README.md unchanged (it trains on scikit-learn's bundled digits: no
download). Rank 0 gets its own ``--out`` folder and ranks 1 and 2 another one (an MPMD launch of
the same script), so the test sees who writes what: only rank 0 prints reports and progress and
writes ``log``, ``cg.dot`` and plots; every rank writes its own snapshots. The first run is
killed (SIGKILL to every process of the job) once a complete generation of snapshots is on disk;
the same command then resumes from a generation > 0 and ends at the configured iteration.
"""

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

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


def _command(tmp_path):
    python = [sys.executable, str(tmp_path / 'train.py'), '--epoch', str(EPOCHS)]
    return ([find_mpiexec(), '-n', '1'] + python + ['--out', str(tmp_path / 'out0'), ':',
            '-n', '2'] + python + ['--out', str(tmp_path / 'out12')])


def _env():
    return dict(os.environ, PYTHONUNBUFFERED='1', CHAINERMN_TIMEOUT='240')


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

    res = run_in_session(_command(tmp_path), timeout=600, cwd=str(tmp_path), env=_env())
    report = 'status {} after {:.0f}s{}\n--- first run ---\n{}\n--- stdout ---\n{}\n--- stderr ---\n{}'.format(
        res.returncode, res.seconds, ' (TIMED OUT)' if res.timed_out else '', first[-4000:],
        res.stdout[-8000:], res.stderr[-8000:])
    assert not res.timed_out and res.returncode == 0, report

    # Resumed: rank 0 says once which generation all ranks loaded (each rank its own file).
    loaded = LOADED.findall(res.stderr)
    assert len(loaded) == 1, report
    generation = int(loaded[0][0])
    assert 0 < generation < LAST and generation % PER_EPOCH == 0, report
    assert loaded[0][1].startswith('same world size, own files'), report

    # ... and reached the configured end.
    final = FINAL.findall(res.stdout)
    assert len(final) == 1, report
    assert int(final[0][0]) == LAST, report
    assert float(final[0][1]) > 0.9, report

    # One report: the header once, each epoch once (Chainer 7.8.1's PrintReport prints the log
    # that LogReport got back from the snapshot again, from epoch 1).
    assert res.stdout.count('validation/main/accuracy') == 2, report  # the header and FINAL
    rows = [int(e) for e in ROW.findall(res.stdout)]
    assert rows in (list(range(1, EPOCHS + 1)),
                    list(range(generation // PER_EPOCH + 1, EPOCHS + 1))), (rows, report)
    # One progress bar: every 10th iteration after the resumed one, once each.
    bars = [int(i) for i in BAR.findall(res.stdout)]
    assert bars == [i for i in range(generation + 1, LAST + 1) if i % 10 == 0], (bars, report)

    # Only rank 0 wrote files besides snapshots; the completed run removed every snapshot.
    assert sorted(os.listdir(str(tmp_path / 'out12'))) == ['checkpoints'], report
    assert os.listdir(str(tmp_path / 'out12' / 'checkpoints')) == [], report
    out0 = set(os.listdir(str(tmp_path / 'out0')))
    assert {'log', 'cg.dot', 'checkpoints'} <= out0, out0
    assert os.listdir(str(tmp_path / 'out0' / 'checkpoints')) == [], report
    with open(str(tmp_path / 'out0' / 'log')) as f:
        log = json.load(f)
    assert [e['epoch'] for e in log] == list(range(1, EPOCHS + 1)), log
    assert log[-1]['iteration'] == LAST, log
