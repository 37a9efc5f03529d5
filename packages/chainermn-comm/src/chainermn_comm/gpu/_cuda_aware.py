"""Decide whether the MPI library accepts CUDA device pointers.

Order: ``$CHAINERMN_CUDA_AWARE`` (``1``/``0``) overrides; otherwise the library is asked
(``MPIX_Query_cuda_support`` of Open MPI and MPICH >= 4.1, ``MPIX_GPU_query_support`` of
MPICH >= 4); otherwise vendor switches (``MV2_USE_CUDA=1`` for MVAPICH2,
``I_MPI_OFFLOAD>=1`` for Intel MPI).  When nothing says yes, the answer is no: device
pointers are never handed to an MPI that may not understand them.
"""

import ctypes
import os

from chainermn_comm import settings
from chainermn_comm.protocol import CUDA_AWARE_ENV

__all__ = ['CUDA_AWARE_ENV', 'parse_override', 'query_library', 'decide', 'detect_cuda_aware']

_cached = None


def parse_override(value):
    """Return True/False for a ``$CHAINERMN_CUDA_AWARE`` value, None when unset, empty or ``auto``."""
    return settings.read(CUDA_AWARE_ENV, environ={} if value is None else {CUDA_AWARE_ENV: value})


def query_library(lib):
    """Ask the MPI library ``lib`` (a ctypes.CDLL) about CUDA support; return (bool or None, how)."""
    fn = getattr(lib, 'MPIX_Query_cuda_support', None) if lib is not None else None
    if fn is not None:
        fn.restype = ctypes.c_int
        fn.argtypes = []
        return bool(fn()), 'MPIX_Query_cuda_support()'
    fn = getattr(lib, 'MPIX_GPU_query_support', None) if lib is not None else None
    if fn is not None:
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_int)]
        out = ctypes.c_int(0)
        if fn(0, ctypes.byref(out)) == 0:  # 0 == MPIX_GPU_SUPPORT_CUDA, 0 == MPI_SUCCESS
            return bool(out.value), 'MPIX_GPU_query_support(CUDA)'
    return None, None


def _vendor_hint(library_version, env):
    text = (library_version or '').lower()
    if 'mvapich' in text:
        return env.get('MV2_USE_CUDA', '').strip() == '1', 'MVAPICH2 with MV2_USE_CUDA={!r}'.format(
            env.get('MV2_USE_CUDA', ''))
    if 'intel' in text:
        offload = env.get('I_MPI_OFFLOAD', '').strip()
        return offload not in ('', '0'), 'Intel MPI with I_MPI_OFFLOAD={!r}'.format(offload)
    return None, None


def decide(env, library_version, query_result):
    """Return (cuda_aware, reason) from the environment, the MPI version string and a library query."""
    override = parse_override(env.get(CUDA_AWARE_ENV))
    if override is not None:
        return override, '{}={}'.format(CUDA_AWARE_ENV, env.get(CUDA_AWARE_ENV).strip())
    answer, how = query_result
    if answer is not None:
        return answer, '{} returned {}'.format(how, int(answer))
    hint, how = _vendor_hint(library_version, env)
    if hint is not None:
        return hint, how
    return False, 'the MPI library offers no CUDA-support query (set {}=1 if it is CUDA-aware)'.format(
        CUDA_AWARE_ENV)


def _mpi_library():
    from mpi4py import MPI
    try:
        return ctypes.CDLL(MPI.__file__)
    except OSError:
        return None


def detect_cuda_aware(refresh=False):
    """Return (cuda_aware, reason) for the MPI library mpi4py is using (cached)."""
    global _cached
    if _cached is None or refresh:
        from mpi4py import MPI
        try:
            version = MPI.Get_library_version()
        except Exception:
            version = ''
        env = os.environ
        if parse_override(env.get(CUDA_AWARE_ENV)) is not None:
            query = (None, None)
        else:
            try:
                query = query_library(_mpi_library())
            except Exception:
                query = (None, None)
        _cached = decide(env, version, query)
    return _cached
