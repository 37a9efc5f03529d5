"""CuPy, NCCL and GPU facts, and a CUDA-aware MPI test run in a subprocess."""

import os
import subprocess
import sys

__all__ = ['gpu_facts', 'cuda_aware_check', 'CUDA_AWARE_SCRIPT']


def _cupy_status():
    """Return (cupy module or None, error message or None, number of CUDA devices)."""
    try:
        import cupy
    except Exception as e:  # ImportError, or CUDA libraries missing
        return None, 'CuPy is not importable ({}: {})'.format(type(e).__name__, e), 0
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:
        return cupy, 'CuPy cannot see a CUDA device ({}: {})'.format(type(e).__name__, e), 0
    return cupy, (None if count > 0 else 'CuPy sees no CUDA device'), count


def gpu_facts():
    """Return a dict: cupy version or error, CUDA runtime version, device count, NCCL version or error."""
    cupy, err, count = _cupy_status()
    facts = {'cupy': None, 'cupy_error': err, 'devices': count, 'cuda': None,
             'nccl': None, 'nccl_error': None}
    if cupy is None:
        return facts
    facts['cupy'] = cupy.__version__
    try:
        facts['cuda'] = cupy.cuda.runtime.runtimeGetVersion()
    except Exception:
        pass
    try:
        from cupy.cuda import nccl
        facts['nccl'] = nccl.get_version()
    except Exception as e:
        facts['nccl_error'] = '{}: {}'.format(type(e).__name__, e)
    return facts


#: The manual's check_cuda_aware.c in Python: MPI_Reduce straight from/to device buffers.
CUDA_AWARE_SCRIPT = r'''
import cupy
from mpi4py import MPI
comm = MPI.COMM_WORLD
cupy.cuda.Device(comm.rank % cupy.cuda.runtime.getDeviceCount()).use()
send = cupy.full(1, comm.rank, dtype=cupy.int32)
recv = cupy.zeros(1, dtype=cupy.int32)
cupy.cuda.get_current_stream().synchronize()
comm.Reduce([send, MPI.INT], [recv, MPI.INT], op=MPI.SUM, root=0)
if comm.rank == 0:
    print('CUDA-AWARE-RESULT', int(recv.get()[0]), comm.size * (comm.size - 1) // 2, flush=True)
'''


def _clean_env():
    return {k: v for k, v in os.environ.items()
            if not k.startswith(('PMI_', 'PMIX_', 'OMPI_', 'HYDRA_', 'MPI_LOCAL'))}


def cuda_aware_check(mpiexec, timeout=120):
    """Return (ok, detail): run the Reduce-on-device test under ``mpiexec -n 2`` (or alone)."""
    cmd = [sys.executable, '-c', CUDA_AWARE_SCRIPT]
    if mpiexec:
        cmd = [mpiexec, '-n', '2'] + cmd
    try:
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              stdin=subprocess.DEVNULL, timeout=timeout, env=_clean_env())
    except subprocess.TimeoutExpired:
        return False, 'the test hung for {} s (MPI_Reduce on device buffers)'.format(timeout)
    except OSError as e:
        return False, 'could not run the test: {}'.format(e)
    out = proc.stdout.decode(errors='replace')
    for line in out.splitlines():
        parts = line.split()
        if parts[:1] == ['CUDA-AWARE-RESULT'] and len(parts) == 3:
            if parts[1] == parts[2] and proc.returncode == 0:
                return True, 'MPI_Reduce on CuPy device buffers gave {} as expected ({} ranks)'.format(
                    parts[1], 2 if mpiexec else 1)
            return False, 'MPI_Reduce on device buffers gave {}, expected {}'.format(parts[1], parts[2])
    tail = ' | '.join(out.strip().splitlines()[-3:])
    return False, 'MPI_Reduce on device buffers failed (exit status {}): {}'.format(
        proc.returncode, tail[-300:])
