"""Helpers shared by the per-rank test files (deterministic data, expected topology)."""

import functools
import os

import numpy

__all__ = ['NUMERIC', 'SENDABLE', 'make', 'assert_same', 'contig', 'expected_topology', 'reduce_expected']

#: Every numeric dtype the communicators must handle (reductions included).
NUMERIC = ('int8', 'int16', 'int32', 'int64', 'uint8', 'uint16', 'uint32', 'uint64',
           'float16', 'float32', 'float64', 'complex64', 'complex128')
#: Dtypes that point-to-point and broadcast must carry besides NUMERIC.
SENDABLE = NUMERIC + ('bool', 'longdouble', 'datetime64[s]')


def make(dtype, shape, seed):
    """Return a deterministic array of ``dtype`` and ``shape`` that depends on ``seed``."""
    dt = numpy.dtype(dtype)
    n = int(numpy.prod(shape, dtype=numpy.int64))
    base = numpy.arange(n) % 7 + seed
    if dt.kind == 'b':
        a = (base % 2).astype(bool)
    elif dt.kind == 'c':
        a = (base + 1j * (base + 1)).astype(dt)
    elif dt.kind == 'M':
        a = base.astype('int64').astype(dt)
    else:
        a = base.astype(dt)
    return a.reshape(shape)


def assert_same(got, want):
    """Assert same type, shape and dtype; values exact for non-floats, within tolerance for floats."""
    assert isinstance(got, numpy.ndarray), type(got)
    assert got.shape == want.shape, (got.shape, want.shape)
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    if want.dtype.kind in 'fc':
        rtol = 1e-3 if want.dtype == numpy.float16 else 1e-6
        numpy.testing.assert_allclose(got, want, rtol=rtol, atol=0)
    else:
        numpy.testing.assert_array_equal(got, want)


def reduce_expected(arrays, op):
    """Reduce ``arrays`` with ``op`` the way MPI would, keeping the dtype."""
    fn = {'sum': numpy.add, 'prod': numpy.multiply, 'max': numpy.maximum, 'min': numpy.minimum}[op]
    return functools.reduce(lambda a, b: fn(a, b).astype(a.dtype), arrays)


def expected_topology(rank, size):
    """Return (intra_rank, intra_size, inter_rank, inter_size) for this machine or the simulated one."""
    per = os.environ.get('CHAINERMN_RANKS_PER_NODE', '').strip()
    per = int(per) if per else size
    node = rank // per
    first = node * per
    return rank - first, min(per, size - first), node, -(-size // per)


def contig(a):
    """Return a C-contiguous copy of ``a`` with the same shape (0-d stays 0-d)."""
    return a.copy(order='C')
