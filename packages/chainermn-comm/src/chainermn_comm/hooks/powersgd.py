"""PowerSGD: average low-rank approximations of the gradients, with error feedback and warm start.

After Vogels, Karimireddy and Jaggi, "PowerSGD: Practical Low-Rank Gradient Compression for
Distributed Optimization" (NeurIPS 2019).  Per update, for every gradient of two or more axes
(reshaped to ``rows x columns``, rows the first axis) whose factors are at least
``min_compression`` times smaller than itself:

1. ``M = G + E`` (the rank's gradient plus its error memory ``E``);
2. ``P = M Q`` (``Q``: ``columns x rank``, last update's average: warm start), averaged over ranks;
3. ``P`` orthonormalised (the same bits on every rank: identical input, identical code);
4. ``Q = M^T P``, averaged over ranks;
5. the gradient becomes ``P Q^T``, the same on every rank, and ``E = M - P Q^T``.

Vectors, scalars and matrices too small to gain are averaged exactly, in the same all-reduce as
the ``P`` factors (or in ``exact_wire``, e.g. ``'bfloat16'``, in their own).  Until update
``start_update`` every gradient is averaged exactly.  Works on host (NumPy) and device (CuPy)
gradients: the arithmetic uses the gradients' array module, the all-reduces the communicator's
own gradient path (:func:`chainermn_comm.hooks.mean`).
"""

import numpy

from chainermn_comm import _arrays, trace
from chainermn_comm.hooks import lowrank
from chainermn_comm.hooks import powersgd_state
from chainermn_comm.hooks.base import CommHook, mean
from chainermn_comm.reduce import dtypes as _dtypes

__all__ = ['PowerSGD']


class _Plan:
    """How one bucket (its names, shapes and dtypes) is compressed: which arrays, where P and Q go."""

    def __init__(self, xp, grads, rank, min_compression):
        self.exact = []
        self.groups = {}  # dtype -> [(index, rows, cols, rank, p offset, q offset)], flat P, flat Q
        sizes = {}
        for i, g in enumerate(grads):
            r = lowrank.compressed_rank(g.shape, rank, min_compression) if g.dtype.kind == 'f' else 0
            if not r:
                self.exact.append(i)
                continue
            n, m = lowrank.matrix_shape(g.shape)
            po, qo = sizes.get(g.dtype, (0, 0))
            self.groups.setdefault(g.dtype, [[], None, None])[0].append((i, n, m, r, po, qo))
            sizes[g.dtype] = (po + n * r, qo + m * r)
        for dtype, group in self.groups.items():
            group[1] = xp.empty(sizes[dtype][0], dtype=dtype)
            group[2] = xp.empty(sizes[dtype][1], dtype=dtype)

    def entries(self):
        """Yield ``(index, rows, cols, rank, P view, Q view)`` of every compressed gradient."""
        for entries, pflat, qflat in self.groups.values():
            for i, n, m, r, po, qo in entries:
                yield i, n, m, r, pflat[po:po + n * r].reshape(n, r), qflat[qo:qo + m * r].reshape(m, r)

    def flats(self, which):
        return [g[which] for g in self.groups.values()]


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
        self._q = {}       # name -> Q (columns x rank), the last update's average
        self._error = {}   # name -> E (rows x columns), this rank's error memory
        self._loaded = {}  # name -> (Q, E) host arrays from a snapshot, taken at first use
        self._plans = {}
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
        plan = self._plan_for(xp, bucket)
        device = xp is not numpy
        on = trace.ON
        started = trace.begin(device) if on else None
        mats = []
        for i, n, m, r, p, q in plan.entries():
            mat = self._with_error(xp, bucket.names[i], grads[i].reshape(n, m))
            xp.matmul(mat, q, out=p)
            mats.append(mat)
        if on:
            trace.end(started, 'powersgd compress', 'compute', {'hook': self.name})
        exact = [grads[i] for i in plan.exact]
        self._mean(comm, exact, plan.flats(1), 'P')
        started = trace.begin(device) if on else None
        for (i, n, m, r, p, q), mat in zip(plan.entries(), mats):
            lowrank.orthogonalize(xp, p)
            xp.matmul(mat.T, p, out=q)
        if on:
            trace.end(started, 'powersgd orthogonalize', 'compute', {'hook': self.name})
        self._mean(comm, [], plan.flats(2), 'Q')
        started = trace.begin(device) if on else None
        for (i, n, m, r, p, q), mat in zip(plan.entries(), mats):
            out = grads[i].reshape(n, m)
            xp.matmul(p, q.T, out=out)
            if self.error_feedback:
                mat -= out  # mat is the error memory: M - P Q^T
        if on:
            trace.end(started, 'powersgd decompress', 'compute', {'hook': self.name})
        sent = sum(f.nbytes for f in plan.flats(1) + plan.flats(2)) + sum(g.nbytes for g in exact)
        self.last = {'compressed': len(mats), 'exact': len(exact), 'bytes': int(sent)}

    # -- internals --------------------------------------------------------------------------------
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

    def _plan_for(self, xp, bucket):
        key = (xp.__name__, tuple(bucket.names), tuple((g.shape, g.dtype.str) for g in bucket.grads))
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = _Plan(xp, bucket.grads, self.rank, self.min_compression)
            for i, n, m, r, p, q in plan.entries():
                self._adopt_q(xp, bucket.names[i], q)
        if not self.warm_start:
            for i, n, m, r, p, q in plan.entries():
                q[...] = lowrank.initial_q(xp, bucket.names[i], m, r, self.seed + self.updates, q.dtype)
        return plan

    def _adopt_q(self, xp, name, q):
        """Fill ``q`` with the name's last Q (kept, loaded or the first one) and keep ``q`` as it."""
        m, r = q.shape
        old = self._q.get(name)
        if old is None and name in self._loaded and self._loaded[name][0] is not None:
            old = self._loaded[name][0]
        if old is not None and tuple(old.shape) == (m, r):
            q[...] = old if _arrays.is_device(q) == _arrays.is_device(old) else _arrays.like(
                _arrays.as_host(old), q)
        else:
            q[...] = lowrank.initial_q(xp, name, m, r, self.seed, q.dtype)
        self._q[name] = q

    def _with_error(self, xp, name, mat):
        """Return ``M = G + E`` (in the error memory) with error feedback, else the gradient itself."""
        if not self.error_feedback:
            return mat
        err = self._error.get(name)
        if err is None or err.shape != mat.shape:
            loaded = self._loaded.pop(name, (None, None))[1]
            if loaded is not None and tuple(loaded.shape) == mat.shape:
                err = _arrays.like(numpy.array(loaded, dtype=mat.dtype), mat)
            else:
                err = xp.zeros_like(mat)
            self._error[name] = err
        err += mat
        return err

    def serialize(self, serializer):
        """Save or load the update count, every ``Q`` and (per rank) every error memory."""
        powersgd_state.serialize(self, serializer)
