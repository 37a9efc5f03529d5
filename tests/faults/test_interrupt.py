"""Ctrl-C on the launcher ends the job with one short report (issue 54 item 3), not a traceback per rank.

A 2-rank trainer with a multi-node checkpointer (every 50 iterations) gets SIGINT on ``mpiexec``
after iteration 60: the job ends with status 130 and one line, ``chainermn: the job was
interrupted (Ctrl-C) at iteration N; newest complete checkpoint: iteration M ('cp' in DIR)``;
nothing else of chainermn's but the lines of the communicator's creation and the tuner, and the
launcher's own lines.
"""

import os
import re
import signal
import time

import pytest

from chainermn_comm.protocol import VARIABLES
from chainermn_comm.testing import run_mpi

HERE = os.path.dirname(os.path.abspath(__file__))
JOB = os.path.join(HERE, 'jobs', 'job_interrupt.py')
DEFAULTS = {name: None for name in VARIABLES}
#: Lines the launcher (MPICH's Hydra) prints on Ctrl-C and on MPI_Abort; not chainermn's.
LAUNCHER = re.compile(r'^(\[mpiexec@[^\]]*\] .*|Abort\(130\) on node \d+ .*|)$')
#: Lines of the communicator's creation and of the tuner (rank 0), printed before the interrupt.
SETUP = re.compile(r'^chainermn: \[rank 0 host [^\]]+\] (BLAS and OpenMP threads|oversubscribed|'
                   r'multi_node_mean_grad tuned|gradient averaging)')


def report(res):
    return 'status {} after {:.1f}s{}\n--- stdout ---\n{}\n--- stderr ---\n{}'.format(
        res.returncode, res.seconds, ' (TIMED OUT)' if res.timed_out else '',
        res.stdout[-4000:], res.stderr[-8000:])


@pytest.mark.parametrize('hook', ['', 'hook'])
def test_ctrl_c_on_the_launcher_gives_one_short_report(tmp_path, hook):
    out = str(tmp_path)
    sent = {}

    def interrupt_when_ready(proc):
        ready = os.path.join(out, 'ready')
        deadline = time.monotonic() + 100
        while not os.path.exists(ready) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        if os.path.exists(ready):
            sent['at'] = time.monotonic()
            proc.send_signal(signal.SIGINT)   # Ctrl-C on mpiexec: it forwards SIGINT to the ranks

    res = run_mpi([JOB, out] + ([hook] if hook else []), 2, timeout=150, env=DEFAULTS,
                  on_start=interrupt_when_ready)
    assert 'at' in sent and not res.timed_out, report(res)
    assert res.returncode == 130, report(res)
    lines = res.stdout.splitlines() + res.stderr.splitlines()
    ours = [line for line in lines if not LAUNCHER.match(line) and not SETUP.match(line)]
    assert len(ours) == 1, report(res)
    m = re.match(r"^chainermn: the job was interrupted \(Ctrl-C\) at iteration (\d+); newest complete "
                 r"checkpoint: iteration (\d+) \('cp' in (.+)\)$", ours[0])
    assert m, report(res)
    iteration, checkpoint = int(m.group(1)), int(m.group(2))
    assert iteration >= 60 and checkpoint % 50 == 0 and 50 <= checkpoint <= iteration, report(res)
    assert m.group(3) == os.path.join(out, 'cp'), report(res)
    for rank in (0, 1):   # that checkpoint is whole: every rank's file is there
        assert os.path.exists(os.path.join(out, 'cp', 'cp.{}.{}'.format(rank, checkpoint))), report(res)
    assert 'Traceback' not in res.stderr and 'KeyboardInterrupt' not in res.stderr, report(res)
    assert len(lines) <= 8, report(res)
