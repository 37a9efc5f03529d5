"""Lazy detection of CuPy, CUDA devices and NCCL, keeping the original import error."""

from chainermn_comm.install_hints import GPU_INSTALL_HINT

__all__ = ['cupy_status', 'gpu_available', 'nccl_available', 'require_gpu', 'GPU_INSTALL_HINT']

_status = None


def cupy_status():
    """Return (cupy module or None, error message or None, number of CUDA devices)."""
    global _status
    if _status is None:
        try:
            import cupy
        except Exception as e:  # ImportError, or CUDA libraries missing
            _status = (None, 'CuPy is not importable ({}: {})'.format(type(e).__name__, e), 0)
        else:
            try:
                count = cupy.cuda.runtime.getDeviceCount()
            except Exception as e:
                _status = (cupy, 'CuPy cannot see a CUDA device ({}: {})'.format(type(e).__name__, e), 0)
            else:
                err = None if count > 0 else 'CuPy sees no CUDA device'
                _status = (cupy, err, count)
    return _status


def gpu_available():
    """Return True when CuPy imports and at least one CUDA device is visible."""
    return cupy_status()[1] is None


def nccl_available():
    """Return (True, None) when CuPy's NCCL bindings import, else (False, reason)."""
    if not gpu_available():
        return False, cupy_status()[1]
    try:
        from cupy.cuda import nccl  # NOQA
    except Exception as e:
        return False, 'CuPy was built without NCCL ({}: {})'.format(type(e).__name__, e)
    return True, None


def require_gpu(name, needs_nccl):
    """Raise CommunicatorUnavailableError unless ``name`` can run here."""
    from chainermn_comm._errors import CommunicatorUnavailableError
    ok, reason = (nccl_available() if needs_nccl else (gpu_available(), cupy_status()[1]))
    if not ok:
        needs = 'CuPy, a CUDA GPU and NCCL 2' if needs_nccl else 'CuPy and a CUDA GPU'
        raise CommunicatorUnavailableError(
            "communicator '{}' needs {}, but {}. To fix: {}; or use "
            "create_communicator('naive') for CPU-only runs.".format(name, needs, reason, GPU_INSTALL_HINT))
