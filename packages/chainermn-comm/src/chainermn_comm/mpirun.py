"""Run a command under ``mpiexec -n N`` in its own session; kill the whole session on timeout.

Used by the tests of every package (:mod:`chainermn_comm.testing`) and by the tools
(``chainermn_tools.cluster``): one implementation of "start MPI ranks, never wait forever".
"""

import collections
import os
import shutil
import signal
import subprocess
import sys
import time

from chainermn_comm.protocol import TIMEOUT_ENV

__all__ = ['MpiResult', 'find_mpiexec', 'run_mpi']

MpiResult = collections.namedtuple('MpiResult', ['returncode', 'stdout', 'stderr', 'seconds', 'timed_out'])


def find_mpiexec():
    """Return the mpiexec next to this Python (the venv's MPI) or the first one on PATH."""
    here = os.path.join(os.path.dirname(sys.executable), 'mpiexec')
    if os.access(here, os.X_OK):
        return here
    found = shutil.which('mpiexec')
    if found is None:
        raise RuntimeError('mpiexec not found: install an MPI (e.g. `pip install mpich mpi4py`) '
                           'or put your MPI\'s bin directory on PATH')
    return found


def _kill_session(proc):
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def run_mpi(args, n, timeout=120, env=None, cwd=None, mpiexec_args=(), python=True,
            on_start=None):
    """Run ``[python] args...`` under ``mpiexec -n n``; return an MpiResult, killing all ranks on timeout.

    ``on_start(proc)`` is called once the launcher runs (e.g. to send signals from a test).
    ``env`` adds to this process's environment; a value None removes that variable (e.g.
    ``{'CHAINERMN_TIMEOUT': None}`` runs the job with the default watchdog timeout).
    """
    cmd = [find_mpiexec(), '-n', str(n)] + list(mpiexec_args)
    if python:
        cmd.append(sys.executable)
    cmd += [str(a) for a in args]
    full_env = dict(os.environ)
    full_env.setdefault('PYTHONUNBUFFERED', '1')
    # Fail fast instead of waiting for the default 30-minute watchdog.
    full_env.setdefault(TIMEOUT_ENV, str(max(10, int(timeout) - 5)))
    for k, v in (env or {}).items():
        if v is None:
            full_env.pop(k, None)
        else:
            full_env[k] = str(v)
    start = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=full_env,
                            cwd=cwd, start_new_session=True, stdin=subprocess.DEVNULL)
    if on_start is not None:
        on_start(proc)
    timed_out = False
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        _kill_session(proc)
        out, err = proc.communicate()
    finally:
        _kill_session(proc)
    return MpiResult(proc.returncode, out.decode(errors='replace'), err.decode(errors='replace'),
                     time.monotonic() - start, timed_out)
