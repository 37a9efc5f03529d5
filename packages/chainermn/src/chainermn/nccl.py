"""``chainermn.nccl`` (v7's path): CuPy's NCCL bindings when CuPy has them; imports without CuPy.

The names (``NcclCommunicator``, ``get_unique_id``, ``NCCL_SUM``, ...) are ``cupy.cuda.nccl``'s own
objects, there only where that module imports (CuPy is optional: it is imported on first use of
a name); ``_available`` says whether it does.
"""

import importlib

__all__ = []

#: The names v7's ``chainermn.nccl`` takes from ``cupy.cuda.nccl``.
_NAMES = ('get_build_version', 'get_unique_id', 'get_version', 'NCCL_FLOAT', 'NCCL_FLOAT16',
          'NCCL_FLOAT32', 'NCCL_FLOAT64', 'NCCL_SUM', 'NcclCommunicator', 'NcclError')


def _nccl():
    """Return ``cupy.cuda.nccl``, or None where CuPy (or its NCCL) cannot be imported."""
    try:
        return importlib.import_module('cupy.cuda.nccl')
    except Exception:   # no CuPy, CuPy without NCCL, or CUDA libraries missing
        return None


def __getattr__(name):
    """Return ``cupy.cuda.nccl``'s ``name`` (``_available``: whether CuPy's NCCL imports)."""
    if name == '_available':
        return _nccl() is not None
    module = _nccl() if name in _NAMES else None
    if module is None or not hasattr(module, name):
        raise AttributeError("module 'chainermn.nccl' has no attribute {!r}{}".format(
            name, ' (CuPy with NCCL is not available here)' if name in _NAMES else ''))
    return getattr(module, name)
