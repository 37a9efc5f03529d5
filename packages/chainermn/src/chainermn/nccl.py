"""``chainermn.nccl`` (v7's path): CuPy's NCCL bindings when CuPy has them; imports without CuPy.

The names (``NcclCommunicator``, ``get_unique_id``, ``NCCL_SUM``, ...) are ``cupy.cuda.nccl``'s own
objects and exist only where that module imports; ``_available`` says whether it did.
"""

__all__ = []

try:
    from cupy.cuda.nccl import (NCCL_FLOAT, NCCL_FLOAT16, NCCL_FLOAT32, NCCL_FLOAT64,  # noqa: F401
                                NCCL_SUM, NcclCommunicator, NcclError, get_build_version,
                                get_unique_id, get_version)
except Exception:   # no CuPy, or CuPy without NCCL (ImportError, or CUDA libraries missing)
    _available = False
else:
    _available = True
    __all__ = ['get_build_version', 'get_unique_id', 'get_version', 'NCCL_FLOAT', 'NCCL_FLOAT16',
               'NCCL_FLOAT32', 'NCCL_FLOAT64', 'NCCL_SUM', 'NcclCommunicator', 'NcclError']
