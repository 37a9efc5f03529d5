"""PowerSGD: average low-rank approximations of the gradients, with error feedback and warm start.

After Vogels, Karimireddy and Jaggi, "PowerSGD: Practical Low-Rank Gradient Compression for
Distributed Optimization" (NeurIPS 2019).  Per update, for every gradient of two or more axes
(reshaped to ``rows x columns``, rows the first axis) whose factors are at least
``min_compression`` times smaller than itself:

1. ``M = G + E`` (the rank's gradient plus its error memory ``E``, in place in ``E``);
2. ``P = M Q`` (``Q``: ``columns x rank``, last update's average: warm start), averaged over ranks;
3. ``P`` orthonormalised (the same bits on every rank: identical input, identical code; the
   factors of one shape in one batch);
4. ``Q = M^T P``, averaged over ranks;
5. the gradient becomes ``P Q^T``, the same on every rank, and ``E = M - P Q^T``.

Vectors, scalars and matrices too small to gain are averaged exactly, in the same all-reduce as
the ``P`` factors (or in ``exact_wire``, e.g. ``'bfloat16'``, in their own).  Until update
``start_update`` every gradient is averaged exactly.  Works on host (NumPy) and device (CuPy)
gradients: the arithmetic uses the gradients' array module, the all-reduces the communicator's
own gradient path (:func:`chainermn_comm.hooks.mean`).  Both factors are kept transposed
(``rank x rows``, ``rank x columns``, C-contiguous).  On the host the products run a block of
rows at a time with steps 1 and 2 in one pass (:mod:`chainermn_comm.hooks.lowrank_host`), or,
where every rank has Numba (and ``CHAINERMN_POWERSGD_JIT`` is not 0), as single compiled loops
over the rows (:mod:`chainermn_comm.hooks.lowrank_jit`, 1.7x faster); on a device each is one
matrix product.
"""

import numpy

from chainermn_comm import _arrays, log, protocol, settings, trace
from chainermn_comm.hooks import lowrank, lowrank_host, lowrank_jit
from chainermn_comm.hooks import powersgd_state
from chainermn_comm.hooks.base import CommHook, mean
from chainermn_comm.reduce import dtypes as _dtypes

__all__ = ['PowerSGD']


class _Plan:
    """How one bucket (its names, shapes and dtypes) is compressed: which arrays, where P and Q go.

    ``entries``: ``(index, rows, cols, Pt view (rank x rows), Qt view (rank x cols))``, ordered by
    dtype, then rows and rank, so that the factors of one shape are consecutive in the flat P
    buffer of their dtype (``batches``: ``(flat P, offset, count, rows, rank)``).
    """

    def __init__(self, xp, grads, rank, min_compression):
        self.exact = []
        todo = []
        for i, g in enumerate(grads):
            r = lowrank.compressed_rank(g.shape, rank, min_compression) if g.dtype.kind == 'f' else 0
            if r:
                todo.append((_work_dtype(g.dtype).str, lowrank.matrix_shape(g.shape), r, i))
            else:
                self.exact.append(i)
        todo.sort(key=lambda t: (t[0], t[1][0], t[2], t[3]))
        self.pflats, self.qflats, self.entries, self.batches = [], [], [], []
        for dt in sorted({t[0] for t in todo}):
            mine = [t for t in todo if t[0] == dt]
            pflat = xp.empty(sum(n * r for _, (n, _m), r, _ in mine), dtype=dt)
            qflat = xp.empty(sum(m * r for _, (_n, m), r, _ in mine), dtype=dt)
            po = qo = 0
            for _, (n, m), r, i in mine:
                if self.batches and self.batches[-1][0] is pflat and self.batches[-1][3:] == (n, r):
                    b = self.batches[-1]
                    self.batches[-1] = (b[0], b[1], b[2] + 1, n, r)
                else:
                    self.batches.append((pflat, po, 1, n, r))
                self.entries.append((i, n, m, pflat[po:po + n * r].reshape(r, n),
                                     qflat[qo:qo + m * r].reshape(r, m)))
                po, qo = po + n * r, qo + m * r
            self.pflats.append(pflat)
            self.qflats.append(qflat)
        #: What runs each entry's host products (set by PowerSGD; None on a device).
        self.hosts = [None] * len(self.entries)


def _work_dtype(dtype):
    """Return the dtype a gradient's factors and error memory are computed in (float16: float32).

    Products of float16 gradients of magnitude ~100 over a few hundred columns pass float16's
    maximum (65504): in float32 they cannot, and the result is written back in float16.
    """
    return numpy.dtype(numpy.float32) if numpy.dtype(dtype) == numpy.float16 else numpy.dtype(dtype)


def _narrow(xp, host, pt, qt, out, error):
    """Write ``Pt^T Qt`` (computed in the factors' dtype) into the narrower ``out``, within its range.

    Values beyond ``out``'s largest finite one are clipped to it (the gradient stays finite);
    with ``error`` (the error memory, wide), ``error -= out`` as written, so that the next update
    gets back what clipping and rounding left out.
    """
    wide = xp.empty(out.shape, dtype=pt.dtype)
    if host is None:
        xp.matmul(pt.T, qt, out=wide)
    else:
        host.reconstruct(pt, qt, wide, None)
    top = float(numpy.finfo(out.dtype).max)
    xp.clip(wide, -top, top, out=wide)
    out[...] = wide
    if error is not None:
        error -= out


class PowerSGD(CommHook):
    """Average gradients as rank-``rank`` approximations with error feedback (PowerSGD).

    Args:
        rank (int): rank of each gradient's approximation (the factors are ``rows x rank`` and
            ``columns x rank``); higher is closer to the exact average and sends more.
        start_update (int): updates averaged exactly before compression starts.
        min_compression (float): a gradient is compressed only when its factors are at least
            this many times smaller than itself; others are averaged exactly.
        exact_wire: the wire of what is averaged exactly (an ``allreduce_grad_dtype``: None,
            ``'bfloat16'``, ``numpy.float16``).
        error_feedback (bool): add what the approximation left out to the next update's gradient.
        warm_start (bool): start each update's power iteration from the last update's ``Q``.
        seed (int): seed of the first ``Q`` (the same on every rank).
    """

    def __init__(self, rank=4, start_update=100, min_compression=2.0, exact_wire=None,
                 error_feedback=True, warm_start=True, seed=0):
        for what, v, low in (('rank', rank, 1), ('start_update', start_update, 0), ('seed', seed, 0)):
            if isinstance(v, bool) or not isinstance(v, (int, numpy.integer)) or v < low:
                raise ValueError('PowerSGD {} must be an int >= {}; got {!r}'.format(what, low, v))
        if not min_compression > 0:
            raise ValueError('PowerSGD min_compression must be positive; got {!r}'.format(min_compression))
        self.rank = int(rank)
        self.start_update = int(start_update)
        self.min_compression = float(min_compression)
        self.exact_wire = _dtypes.validate_grad_dtype(exact_wire)
        self.error_feedback = bool(error_feedback)
        self.warm_start = bool(warm_start)
        self.seed = int(seed)
        #: Updates seen so far (the first bucket of each update counts it).
        self.updates = 0
        self._q = {}       # name -> Q transposed (rank x columns), the last update's average
        self._error = {}   # name -> E (rows x columns), this rank's error memory
        self._loaded = {}  # name -> (Q, E) host arrays from a snapshot, taken at first use
        self._plans = {}
        self._host = {}    # dtype str -> the host products every rank runs (compiled or NumPy)
        #: What the last call did: arrays compressed and averaged exactly, bytes sent per rank.
        self.last = {}

    @property
    def name(self):
        return 'powersgd-r{}'.format(self.rank)

    def __call__(self, comm, bucket):
        if bucket.first:
            self.updates += 1
        grads = bucket.grads
        if self.updates <= self.start_update or not grads:
            mean(comm, grads, self.exact_wire)
            self.last = {'compressed': 0, 'exact': len(grads), 'bytes': sum(g.nbytes for g in grads)}
            return
        xp = _arrays.array_module_of(grads[0])
        plan = self._plan_for(comm, xp, bucket)
        matmul = xp.matmul
        on = trace.ON
        device = xp is not numpy
        started = trace.begin(device) if on else None
        mats = []
        for (i, n, m, pt, qt), host in zip(plan.entries, plan.hosts):
            grad = grads[i].reshape(n, m)
            if grad.dtype != pt.dtype:  # float16: factors and error memory in float32
                grad = grad.astype(pt.dtype)
            mat = self._error_memory(xp, bucket.names[i], grad) if self.error_feedback else grad
            add = grad if mat is not grad else None
            if device:
                if add is not None:
                    mat += add
                matmul(qt, mat.T, out=pt)
            else:
                host.project(mat, qt, pt, add)
            mats.append(mat)
        self._trace_end(started, 'compress')
        exact = [grads[i] for i in plan.exact]
        self._mean(comm, exact, plan.pflats, 'P')
        started = trace.begin(device) if on else None
        for pflat, off, count, n, r in plan.batches:
            # rows x rank views of the rank x rows factors: each column is contiguous
            lowrank.orthogonalize(xp, pflat[off:off + count * n * r].reshape(count, r, n).transpose(0, 2, 1))
        for (i, n, m, pt, qt), host, mat in zip(plan.entries, plan.hosts, mats):
            if device:
                matmul(pt, mat, out=qt)
            else:
                host.back_project(mat, pt, qt)
        self._trace_end(started, 'orthogonalize')
        self._mean(comm, [], plan.qflats, 'Q')
        started = trace.begin(device) if on else None
        for (i, n, m, pt, qt), host, mat in zip(plan.entries, plan.hosts, mats):
            out = grads[i].reshape(n, m)
            error = mat if self.error_feedback else None  # the error memory becomes M - P Q^T
            if out.dtype != pt.dtype:
                _narrow(xp, host, pt, qt, out, error)
            elif device:
                matmul(pt.T, qt, out=out)
                if error is not None:
                    error -= out
            else:
                host.reconstruct(pt, qt, out, error)
        self._trace_end(started, 'decompress')
        sent = sum(f.nbytes for f in plan.pflats + plan.qflats) + sum(g.nbytes for g in exact)
        self.last = {'compressed': len(mats), 'exact': len(exact), 'bytes': int(sent)}

    # -- internals --------------------------------------------------------------------------------
    def _trace_end(self, started, what):
        if started is not None:
            trace.end(started, 'powersgd ' + what, 'compute', {'hook': self.name})

    def _mean(self, comm, exact, flats, which):
        """Average the exact gradients and the flat factors (one all-reduce when the wires agree)."""
        started = trace.now() if trace.ON else None
        if self.exact_wire is None:
            mean(comm, exact + flats)
        else:
            mean(comm, exact, self.exact_wire)
            mean(comm, flats)
        if started is not None:
            nbytes = sum(f.nbytes for f in flats) + sum(g.nbytes for g in exact)
            trace.record('powersgd ' + which, 'comm', started, trace.now(),
                         {'bytes': int(nbytes), 'hook': self.name, 'hook_wire': True, 'op': 'mean'})

    def _plan_for(self, comm, xp, bucket):
        key = (xp.__name__, tuple(bucket.names), tuple((g.shape, g.dtype.str) for g in bucket.grads))
        plan = self._plans.get(key)
        if plan is None:
            plan = _Plan(xp, bucket.grads, self.rank, self.min_compression)
            if xp is numpy:
                plan.hosts = [self._host_products(comm, pt.dtype) for _, _, _, pt, _ in plan.entries]
            self._plans[key] = plan
            for i, n, m, pt, qt in plan.entries:
                self._adopt_q(xp, bucket.names[i], qt)
        if not self.warm_start:
            for i, n, m, pt, qt in plan.entries:
                qt[...] = lowrank.initial_q(xp, bucket.names[i], m, qt.shape[0],
                                            self.seed + self.updates, qt.dtype).T
        return plan

    def _host_products(self, comm, dtype):
        """Return what runs the host products of ``dtype``: compiled where every rank can, else NumPy.

        Every rank must reconstruct with the same code (the same bits), so the ranks agree once
        per dtype, at the same call on every rank (the first plan that holds the dtype).
        """
        key = numpy.dtype(dtype).str
        if key not in self._host:
            on = settings.read(protocol.POWERSGD_JIT_ENV)
            mine = lowrank_jit.kernels(key) if on else None
            why = '' if mine is not None else (
                lowrank_jit.why_not(key) if on else '{}=0'.format(protocol.POWERSGD_JIT_ENV))
            mpi = getattr(comm, 'mpi_comm', None)
            whys = mpi.allgather(why) if mpi is not None else [why]
            able = [not w for w in whys]
            broken = any(w.startswith('Numba failed') or w.startswith('the compiled') for w in whys)
            if (broken or any(able)) and not all(able) and (mpi is None or mpi.Get_rank() == 0):
                by_why = {}
                for r, w in enumerate(whys):
                    if w:
                        by_why.setdefault(w, []).append(str(r))
                log.get_logger('hooks').warning(
                    'PowerSGD runs its host products with NumPy and BLAS on every rank: %s',
                    '; '.join('rank {}: {}'.format(', '.join(rs), w) for w, rs in by_why.items()))
            self._host[key] = mine if all(able) else lowrank_host
        return self._host[key]

    @property
    def host_products(self):
        """What ran the host products so far, by dtype: ``'numba'`` or ``'numpy'``."""
        return {k: 'numpy' if v is lowrank_host else 'numba' for k, v in self._host.items()}

    def _adopt_q(self, xp, name, qt):
        """Fill ``qt`` with the name's last Q (kept, loaded or the first one) and keep ``qt`` as it."""
        r, m = qt.shape
        old = self._q.get(name)
        if old is None and self._loaded.get(name, (None,))[0] is not None:
            old = self._loaded[name][0].T  # saved as Q (columns x rank)
        if old is not None and tuple(old.shape) == (r, m):
            qt[...] = old if _arrays.is_device(qt) == _arrays.is_device(old) else _arrays.like(
                numpy.ascontiguousarray(_arrays.as_host(old)), qt)
        else:
            qt[...] = lowrank.initial_q(xp, name, m, r, self.seed, qt.dtype).T
        self._q[name] = qt

    def _error_memory(self, xp, name, mat):
        """Return the error memory ``E`` of ``name`` (shaped as ``mat``; zeros or the loaded one)."""
        err = self._error.get(name)
        if err is None or err.shape != mat.shape:
            loaded = self._loaded.pop(name, (None, None))[1]
            if loaded is not None and tuple(loaded.shape) == mat.shape:
                err = _arrays.like(numpy.array(loaded, dtype=mat.dtype), mat)
            else:
                err = xp.zeros_like(mat)
            self._error[name] = err
        return err

    def serialize(self, serializer):
        """Save or load the update count, every ``Q`` and (per rank) every error memory."""
        powersgd_state.serialize(self, serializer)
