"""PowerSGD's three host products as single loops over the rows, compiled by Numba where it is installed.

Each product reads every gradient row once and keeps the row and the factors' columns in the
core's cache: ``M = E + G`` and ``P = M Q`` in one pass, ``Q = M^T P`` in one, and ``P Q^T``
with ``E -= P Q^T`` in one (BLAS runs a rank of four at a fraction of the memory's speed).
The first two may sum in any order (each rank's own terms, averaged afterwards); the third
sums in one fixed order without fused multiply-adds, so every rank that runs it from the same
factors writes the same bits.  Compiled in memory on first use (about 3 s per dtype), never
cached on disk; :func:`kernels` returns None where Numba cannot be imported or compile, and the
caller then keeps the NumPy products of :mod:`chainermn_comm.hooks.lowrank_host`.
"""

import threading
import warnings

import numpy

__all__ = ['DTYPES', 'kernels', 'why_not', 'Kernels']

#: The dtypes the compiled products take (others use the NumPy products).
DTYPES = ('<f4', '<f8')

_lock = threading.Lock()
_compiled = {}  # dtype str -> Kernels or None
_why = {}       # dtype str -> why there are no kernels for it
_jit = []       # [the three Numba dispatchers] once built, or [None] when Numba is unusable


class Kernels:
    """The compiled products for one dtype, with the signatures of ``lowrank_host``'s."""

    def __init__(self, dtype, project, back_project, reconstruct):
        self._zero = numpy.dtype(dtype).type(0)  # the sums' type: the factors' dtype, as BLAS's
        self._project, self._back, self._reconstruct = project, back_project, reconstruct

    def project(self, mat, qt, pt, add=None):
        """Set ``pt`` (``rank x rows``) to ``Qt M^T``; with ``add``, first ``mat += add``."""
        self._project(mat, mat if add is None else add, add is not None, qt, pt, self._zero)

    def back_project(self, mat, pt, qt):
        """Set ``qt`` (``rank x columns``) to ``Pt M``."""
        self._back(mat, pt, qt)

    def reconstruct(self, pt, qt, out, error=None):
        """Set ``out`` to ``Pt^T Qt``; with ``error``, then ``error -= out`` (the same bits on every rank)."""
        self._reconstruct(pt, qt, out, out if error is None else error, error is not None)


def kernels(dtype):
    """Return the compiled :class:`Kernels` for ``dtype``, or None where Numba cannot serve it."""
    key = numpy.dtype(dtype).str
    if key not in DTYPES:
        return None
    with _lock:
        if key not in _compiled:
            _compiled[key] = _compile(numpy.dtype(key))
        return _compiled[key]


def why_not(dtype):
    """Return why :func:`kernels` gave None for ``dtype`` (after it did), in a few words."""
    key = numpy.dtype(dtype).str
    if key not in DTYPES:
        return 'no compiled products for {}'.format(numpy.dtype(dtype).name)
    return _why.get(key, 'not compiled yet')


def _compile(dtype):
    """Build the dispatchers once and compile them for ``dtype`` on small arrays; None on failure."""
    with warnings.catch_warnings():  # Numba's own warnings would repeat once per rank
        warnings.simplefilter('ignore')
        return _compile_quietly(dtype)


def _compile_quietly(dtype):
    """Compile for ``dtype`` and check the products on small arrays; None on any failure."""
    try:
        if not _jit:
            _jit.append(_build())
        if _jit[0] is None:
            _why[dtype.str] = 'Numba is not installed (pip install "chainermn[powersgd]")'
            return None
        k = Kernels(dtype, *_jit[0])
        rng = numpy.random.RandomState(0)
        for r in (5, 2):  # a group of four columns and single ones; rows by four and single ones
            mat = rng.standard_normal((5, 7)).astype(dtype)
            qt, pt = numpy.ones((r, 7), dtype), numpy.empty((r, 5), dtype)
            k.project(mat, qt, pt, mat.copy())
            k.project(mat, qt, pt)
            k.back_project(mat, pt, qt)
            out = numpy.empty_like(mat)
            k.reconstruct(pt, qt, out, mat)
            k.reconstruct(pt, qt, out)
        if not numpy.allclose(out, pt.T.astype(numpy.float64) @ qt, rtol=1e-4, atol=1e-4):
            _why[dtype.str] = 'the compiled products gave wrong values'
            return None
        return k
    except Exception as e:  # an old or broken Numba, or one that refuses this NumPy: keep BLAS
        _why[dtype.str] = 'Numba failed: {}: {}'.format(type(e).__name__, str(e).splitlines()[0][:200]
                                                        if str(e) else '')
        return None


def _build():
    """Return Numba dispatchers of the three products, or None when Numba cannot be imported."""
    try:
        import numba
    except Exception:
        return None
    # The per-rank sums (P and Q before their averages) may be reordered and fused; the
    # reconstruction may not: it must give every rank the same bits.
    fast = {'reassoc', 'contract', 'nsz', 'arcp'}
    jit_fast = numba.njit(fastmath=fast, nogil=True, cache=False)
    jit_exact = numba.njit(fastmath=False, nogil=True, cache=False)
    return jit_fast(_project), jit_fast(_back_project), jit_exact(_reconstruct)


# The loops below are compiled by Numba (plain Python would take minutes); columns of the
# factors are taken four at a time, then one at a time.

def _project(mat, add, has_add, qt, pt, zero):  # pragma: no cover - compiled
    n, m = mat.shape
    r = qt.shape[0]
    for i in range(n):
        if has_add and r < 4:
            for j in range(m):
                mat[i, j] += add[i, j]
        k = 0
        while k + 4 <= r:
            s0 = s1 = s2 = s3 = zero
            if has_add and k == 0:
                for j in range(m):
                    v = mat[i, j] + add[i, j]
                    mat[i, j] = v
                    s0 += v * qt[0, j]
                    s1 += v * qt[1, j]
                    s2 += v * qt[2, j]
                    s3 += v * qt[3, j]
            else:
                for j in range(m):
                    v = mat[i, j]
                    s0 += v * qt[k, j]
                    s1 += v * qt[k + 1, j]
                    s2 += v * qt[k + 2, j]
                    s3 += v * qt[k + 3, j]
            pt[k, i] = s0
            pt[k + 1, i] = s1
            pt[k + 2, i] = s2
            pt[k + 3, i] = s3
            k += 4
        while k < r:
            s = zero
            for j in range(m):
                s += mat[i, j] * qt[k, j]
            pt[k, i] = s
            k += 1


def _back_project(mat, pt, qt):  # pragma: no cover - compiled
    n, m = mat.shape
    r = qt.shape[0]
    qt[:, :] = 0
    i = 0
    while i + 4 <= n:  # four rows at a time: a quarter of the passes over the factor's columns
        for k in range(r):
            a, b, c, d = pt[k, i], pt[k, i + 1], pt[k, i + 2], pt[k, i + 3]
            for j in range(m):
                qt[k, j] += a * mat[i, j] + b * mat[i + 1, j] + c * mat[i + 2, j] + d * mat[i + 3, j]
        i += 4
    while i < n:
        for k in range(r):
            a = pt[k, i]
            for j in range(m):
                qt[k, j] += a * mat[i, j]
        i += 1


def _reconstruct(pt, qt, out, err, has_err):  # pragma: no cover - compiled
    n, m = out.shape
    r = qt.shape[0]
    for i in range(n):
        k = 0
        while k + 4 <= r:
            p0, p1, p2, p3 = pt[k, i], pt[k + 1, i], pt[k + 2, i], pt[k + 3, i]
            if k == 0 and r == 4 and has_err:
                for j in range(m):
                    v = p0 * qt[0, j] + p1 * qt[1, j] + p2 * qt[2, j] + p3 * qt[3, j]
                    out[i, j] = v
                    err[i, j] -= v
            elif k == 0:
                for j in range(m):
                    out[i, j] = p0 * qt[0, j] + p1 * qt[1, j] + p2 * qt[2, j] + p3 * qt[3, j]
            else:
                for j in range(m):
                    out[i, j] += p0 * qt[k, j] + p1 * qt[k + 1, j] + p2 * qt[k + 2, j] + p3 * qt[k + 3, j]
            k += 4
        while k < r:
            p = pt[k, i]
            if k == 0:
                for j in range(m):
                    out[i, j] = p * qt[0, j]
            else:
                for j in range(m):
                    out[i, j] += p * qt[k, j]
            k += 1
        if has_err and r != 4:
            for j in range(m):
                err[i, j] -= out[i, j]
