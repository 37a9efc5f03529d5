"""``cupy.random`` stand-in: NumPy's generator, results on the current device."""

import numpy

from cupy._ndarray import wrap

__all__ = ['standard_normal', 'rand', 'randn', 'seed']

_rng = numpy.random.RandomState(0)


def seed(s=None):
    """Reseed the generator."""
    _rng.seed(s)


def standard_normal(size=None, dtype=numpy.float64):
    """Return standard normal samples."""
    return wrap(_rng.standard_normal(size).astype(dtype))


def rand(*shape):
    """Return uniform samples in [0, 1)."""
    return wrap(_rng.rand(*shape))


def randn(*shape):
    """Return standard normal samples."""
    return wrap(_rng.randn(*shape))
