"""``python -m chainermn cluster --slurm``: Slurm on the namespace cluster, the job through srun."""

import os
import signal
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from slurm_helpers import JOBS, TRAIN, check_collectives, wait  # noqa: E402

CLI = [sys.executable, '-m', 'chainermn_tools', 'cluster', '--slurm']


def _ours():
    """Pids of Slurm/MUNGE daemons started with one of our chainermn-slurm-* configurations."""
    pids = []
    for p in os.listdir('/proc'):
        try:
            with open('/proc/{}/cmdline'.format(p), 'rb') as f:
                args = f.read()
        except OSError:
            continue
        if b'chainermn-slurm-' in args and (b'slurm' in args.split(b'\0')[0] or b'munged' in args):
            pids.append(p)
    return pids


def _run(args, timeout=300):
    proc = subprocess.run(CLI + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)
    if proc.returncode == 2 and 'chainermn cluster:' in proc.stderr:
        pytest.skip(proc.stderr.strip().splitlines()[-1])
    return proc


@pytest.mark.parametrize('ranks_per_node', [1, 2])
def test_cluster_slurm_runs_the_job_through_srun(ranks_per_node):
    before = set(_ours())
    dirs = {d for d in os.listdir('/tmp') if d.startswith('chainermn-slurm-')}
    proc = _run(['--nodes', '2', '--ranks-per-node', str(ranks_per_node), '--', sys.executable,
                 os.path.join(JOBS, 'collectives.py')])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert 'srun --mpi=pmi2' in proc.stderr
    check_collectives(proc.stdout, 2, 2 * ranks_per_node, 'ofi', first=0)
    assert set(_ours()) <= before, 'Slurm daemons left running'
    assert {d for d in os.listdir('/tmp') if d.startswith('chainermn-slurm-')} <= dirs


def test_cluster_slurm_passes_the_job_status_on():
    proc = _run(['--nodes', '2', '--', sys.executable, '-c', 'import sys; sys.exit(3)'])
    assert proc.returncode == 3, proc.stderr


def test_cluster_slurm_sigterm_reaches_the_ranks(tmp_path):
    """SIGTERM to the command goes to every rank (scancel --signal): checkpoint, exit 75, all removed."""
    before = set(_ours())
    proc = subprocess.Popen(CLI + ['--nodes', '2', '--', sys.executable, TRAIN, str(tmp_path), '100000',
                                   '--gate', '5', '--cp-every', '1000'],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            stdin=subprocess.DEVNULL)
    try:
        wait(lambda: all((tmp_path / 'pid.{}'.format(r)).exists() for r in range(2)) or
              proc.poll() is not None, 180, 'both ranks at iteration 5')
        if proc.poll() == 2:
            pytest.skip(proc.communicate()[0].strip().splitlines()[-1])
        assert proc.poll() is None, proc.communicate()[0]
        proc.send_signal(signal.SIGTERM)
        out = proc.communicate(timeout=120)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 75, out
    for r in range(2):
        assert 'rank {}: preempted (this rank received SIGTERM); all ranks stop at iteration 5'.format(r) in out
    assert set(_ours()) <= before, 'Slurm daemons left running'
