"""A short chaos run (``bench/chaos_run.py``, issue 53 item 4): four faults of four kinds.

2 nodes x 2 ranks under ``python -m chainermn launch``: a rank SIGKILLed at a point of a
background save, a rank stopped (SIGSTOP, then SIGCONT), a node's link down for 10 s, the
checkpoint disk full for one save.  Every fault must be survived (or restarted from the newest
complete generation) and the job must end with parameters and optimizer state bit for bit equal
to a run without faults.  The whole run has a hard timeout; on it, the run is stopped with
SIGTERM so that it removes its nodes, links and tmpfs.
"""

import json
import os
import signal
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CHAOS = os.path.join(ROOT, 'bench', 'chaos_run.py')
KINDS = ('kill-write', 'stop', 'link', 'disk')
TIMEOUT = 720


def test_short_chaos_run_ends_bit_for_bit(tmp_path):
    out = tmp_path / 'chaos.json'
    cmd = [sys.executable, CHAOS, '--minutes', '1.5', '--pace', '0.1', '--faults', str(len(KINDS)),
           '--kinds', ','.join(KINDS), '--stop-seconds', '15', '--seed', '1', '--timeout', '600',
           '--json', str(out)]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        text, _ = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)   # the run removes what it made
        try:
            text, _ = proc.communicate(timeout=90)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            text, _ = proc.communicate()
        raise AssertionError('the chaos run took more than {} s:\n{}'.format(TIMEOUT, text[-8000:]))
    assert out.exists(), text[-8000:]
    result = json.loads(out.read_text())
    totals, faults = result['totals'], result['faults']
    assert sorted(f['kind'] for f in faults) == sorted(KINDS), text[-8000:]
    for f in faults:
        assert f['injected'] and f['survived'], (f, text[-8000:])
        assert f['lost_generations'] == 0, (f, text[-8000:])
    by_kind = {f['kind']: f for f in faults}
    assert by_kind['stop']['restarts'] == 0 and by_kind['disk']['restarts'] == 0, text[-8000:]
    assert by_kind['kill-write']['restarts'] >= 1, text[-8000:]
    assert by_kind['disk']['failed_save'] is not None, text[-8000:]
    assert totals['differing bits'] == 0 and totals['launcher exit status'] == 0, text[-8000:]
    assert totals['bytes compared (4 ranks: parameters + Adam state)'] > 0, text[-8000:]
    assert totals['generations lost or refused'] == 0, text[-8000:]
    assert result['ok'] and totals['verdict'] == 'PASS', text[-8000:]
    assert proc.returncode == 0, text[-8000:]
