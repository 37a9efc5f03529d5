"""PowerSGD's three products on the host (NumPy), a block of rows at a time so that the block stays in cache.

With a rank of a few columns, one BLAS matrix product per gradient packs the whole gradient
into a buffer first (an extra pass over memory) and runs at a fraction of the memory's speed;
a matrix-vector product per factor column over a block of rows that fits in the core's cache
reads each gradient from memory once per product, and adding the error memory in the same
block saves a pass.  The blocking depends only on the shapes, so every rank computes the same
bits where it must (:func:`reconstruct`, from identical averaged factors).
"""

import numpy

__all__ = ['BLOCK_BYTES', 'block_rows', 'project', 'back_project', 'reconstruct']

#: Bytes of one block of rows (half a typical per-core L2 cache: the block and its partner fit).
BLOCK_BYTES = 256 << 10


def block_rows(mat):
    """Return how many rows of ``mat`` (``rows x columns``) make one block."""
    return max(1, BLOCK_BYTES // max(1, mat.shape[1] * mat.itemsize))


def project(mat, qt, pt, add=None):
    """Set ``pt`` (``rank x rows``) to ``Qt M^T``; with ``add``, first ``mat += add`` (``M = E + G``)."""
    n = mat.shape[0]
    b = block_rows(mat)
    dot = numpy.dot
    for s in range(0, n, b):
        blk = mat[s:s + b]
        if add is not None:
            numpy.add(blk, add[s:s + b], out=blk)
        for k in range(qt.shape[0]):
            dot(blk, qt[k], out=pt[k, s:s + b])


def back_project(mat, pt, qt):
    """Set ``qt`` (``rank x columns``) to ``Pt M``, the blocks' products added up in order."""
    n = mat.shape[0]
    b = block_rows(mat)
    dot = numpy.dot
    part = numpy.empty(mat.shape[1], dtype=qt.dtype) if b < n else None
    for s in range(0, n, b):
        blk = mat[s:s + b]
        for k in range(qt.shape[0]):
            if s == 0:
                dot(pt[k, :b], blk, out=qt[k])
            else:
                dot(pt[k, s:s + b], blk, out=part)
                qt[k] += part


def reconstruct(pt, qt, out, error=None):
    """Set ``out`` (``rows x columns``) to ``Pt^T Qt``; with ``error``, then ``error -= out``.

    Block by block (the same blocks on every rank), each block subtracted while in cache.
    """
    n = out.shape[0]
    b = block_rows(out)
    for s in range(0, n, b):
        blk = out[s:s + b]
        numpy.matmul(pt[:, s:s + b].T, qt, out=blk)
        if error is not None:
            eb = error[s:s + b]
            numpy.subtract(eb, blk, out=eb)
