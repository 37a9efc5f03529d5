"""Let Chainer's CUDA backend load on comm's NumPy stand-in for CuPy (tests/fakecupy); call before importing chainer.

The stand-in imitates what chainermn's communicators use; Chainer's ``chainer.backends.cuda``
also imports ``cupy.cuda.cublas``, ``cupyx.scipy`` and a few module-level names at import time.
This adds empty stand-ins for those, so that ``to_device('@cupy:N')`` moves links onto the
stand-in's "device" arrays and NumPy-only code (``Linear``, ``MultiNodeBatchNormalization``)
runs on them.  Chainer's own CUDA kernels (``ElementwiseKernel`` sources) do not run.
"""

import sys
import types

__all__ = ['install']


def _module(name):
    if name not in sys.modules:
        mod = types.ModuleType(name)
        sys.modules[name] = mod
        parent, _, child = name.rpartition('.')
        if parent:
            setattr(sys.modules[parent], child, mod)
    return sys.modules[name]


def install():
    """Add what Chainer imports from CuPy when ``cupy`` is the stand-in; return ``cupy`` (None without one)."""
    try:
        import cupy
    except ImportError:
        return None
    if not getattr(cupy, 'IS_FAKE', False):
        return cupy   # the real CuPy: nothing to add
    if 'chainer' in sys.modules:
        raise RuntimeError('import fakecupy_chainer before chainer: Chainer decides at import time '
                           'whether CuPy is available')
    import cupy.cuda  # NOQA: F401
    for name in ('cupy.cuda.cublas', 'cupyx', 'cupyx.scipy', 'cupyx.scipy.linalg', 'cupyx.scipy.special'):
        _module(name)
    _module('cupy._util').PerformanceWarning = type('PerformanceWarning', (RuntimeWarning,), {})
    cupy.get_default_memory_pool = lambda: None
    cupy.get_default_pinned_memory_pool = lambda: None
    cupy.fuse = lambda *args, **kwargs: (lambda fn: fn)
    if not hasattr(cupy.ndarray, 'dot'):   # Linear's backward calls gy.dot(W)
        cupy.ndarray.dot = lambda self, other: cupy.dot(self, other)
    return cupy
