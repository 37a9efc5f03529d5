"""The arithmetic of low-rank compression: matrix shapes, the first Q, orthogonalisation.

Written with the array module of the gradients (NumPy or CuPy), so the same code runs on both.
Everything that follows an all-reduce is computed identically on every rank from identical
inputs: the orthogonalisation uses elementwise products and sums only (no BLAS call whose
blocking could depend on a thread count), in float64.
"""

import zlib

import numpy

__all__ = ['matrix_shape', 'compressed_rank', 'initial_q', 'orthogonalize']

_TINY = 1e-300


def matrix_shape(shape):
    """Return the ``(rows, columns)`` a gradient of ``shape`` is compressed as (rows: the first axis)."""
    rows = int(shape[0])
    cols = 1
    for s in shape[1:]:
        cols *= int(s)
    return rows, cols


def compressed_rank(shape, rank, min_compression):
    """Return the rank a gradient of ``shape`` is compressed to, or 0 to average it exactly.

    Vectors and scalars are averaged exactly, and so is a matrix whose two factors would not be
    at least ``min_compression`` times smaller than the matrix itself.
    """
    if len(shape) < 2:
        return 0
    n, m = matrix_shape(shape)
    r = min(int(rank), n, m)
    if r < 1 or n * m < min_compression * (n + m) * r:
        return 0
    return r


def initial_q(xp, name, cols, rank, seed, dtype):
    """Return the first ``Q`` (``cols x rank``) of the gradient ``name``: the same bits on every rank.

    Drawn on the host from a generator seeded by ``seed`` and the name, then moved to ``xp``.
    """
    rng = numpy.random.RandomState((int(seed) + zlib.crc32(name.encode('utf-8'))) % (1 << 32))
    q = rng.standard_normal((cols, rank)).astype(dtype)
    return q if xp is numpy else xp.asarray(q)


def orthogonalize(xp, p, eps=0.0):
    """Make the columns of each matrix of ``p`` (``rows x rank``, or ``count x rows x rank``)
    orthonormal in place (modified Gram-Schmidt).

    Computed in float64 with elementwise products and sums; a column that becomes zero (the
    gradient has a lower rank) stays zero.  Matrices of one shape go in one batch: a few array
    operations per column, whatever their number.
    """
    a = p.astype(numpy.float64)
    batch = a if a.ndim == 3 else a[None]
    for j in range(batch.shape[2]):
        col = batch[:, :, j]
        for k in range(j):
            prev = batch[:, :, k]
            col -= xp.sum(prev * col, axis=1, keepdims=True) * prev
        norm = xp.sqrt(xp.sum(col * col, axis=1, keepdims=True))
        col *= (norm > eps) / xp.maximum(norm, _TINY)  # no host sync on a GPU
    p[...] = a.astype(p.dtype)
    return p
