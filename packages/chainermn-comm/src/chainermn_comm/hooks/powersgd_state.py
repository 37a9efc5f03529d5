"""PowerSGD's state in a snapshot: the update count, the ``Q`` factors and the error memories.

Written through a Chainer serializer (duck-typed: comm does not import Chainer) as a few flat
arrays, so a snapshot holds no per-parameter key: ``updates``; ``names``, ``q_shapes`` and ``q``
(the factors, the same on every rank); ``error_names``, ``error_shapes`` and, under
``rank_mean/``, ``error`` (this rank's error memories: a job resumed on another number of ranks
gives every rank the mean of the old ranks' memories).  A hook that has not run yet writes
nothing, so a fresh job expects no key of it and can resume any snapshot.  Loaded arrays stay on
the host until the gradient they belong to is first seen (and moved to its device then).
"""

import numpy

from chainermn_comm import _arrays
from chainermn_comm.hooks.base import RANK_MEAN

__all__ = ['serialize', 'is_loading']


def is_loading(serializer):
    """Return True when ``serializer`` is a Chainer ``Deserializer`` (it loads values)."""
    return any(c.__name__ == 'Deserializer' for c in type(serializer).__mro__)


def _pack(arrays):
    """Return (flat host array, shapes int64 array) of ``arrays`` laid end to end."""
    hosts = [numpy.ascontiguousarray(_arrays.as_host(a)) for a in arrays]
    dtypes = {h.dtype for h in hosts}
    dtype = dtypes.pop() if len(dtypes) == 1 else numpy.dtype(numpy.float64)
    flat = numpy.concatenate([h.reshape(-1).astype(dtype, copy=False) for h in hosts]) if hosts \
        else numpy.zeros(0, numpy.float32)
    shapes = numpy.array([h.shape for h in hosts], dtype=numpy.int64).reshape(len(hosts), 2)
    return flat, shapes


def _unpack(flat, shapes):
    out, off = [], 0
    for n, m in shapes:
        out.append(flat[off:off + n * m].reshape(int(n), int(m)).copy())
        off += int(n) * int(m)
    return out


def serialize(hook, serializer):
    """Save ``hook``'s state with ``serializer``, or load it (see the module docstring)."""
    if is_loading(serializer):
        _load(hook, serializer)
        return
    if hook.updates == 0 and not hook._q and not hook._error and not hook._loaded:
        return  # nothing yet: a fresh job expects no key of the hook
    serializer('updates', numpy.array(hook.updates, dtype=numpy.int64))
    # Loaded state not taken up yet (no update since the load) is saved as it was loaded.
    qs = {n: v[0] for n, v in hook._loaded.items() if v[0] is not None}
    qs.update({n: qt.T for n, qt in hook._q.items()})  # kept transposed: saved as Q (columns x rank)
    errors = {n: v[1] for n, v in hook._loaded.items() if v[1] is not None}
    errors.update(hook._error)
    q_names = sorted(qs)
    q, q_shapes = _pack([qs[n] for n in q_names])
    serializer('names', numpy.array(q_names, dtype=str) if q_names else numpy.zeros(0, 'U1'))
    serializer('q_shapes', q_shapes)
    serializer('q', q)
    e_names = sorted(errors)
    err, e_shapes = _pack([errors[n] for n in e_names])
    serializer('error_names', numpy.array(e_names, dtype=str) if e_names else numpy.zeros(0, 'U1'))
    serializer('error_shapes', e_shapes)
    serializer[RANK_MEAN]('error', err)


def _load(hook, serializer):
    try:
        updates = serializer('updates', None)
    except KeyError:
        return  # the snapshot was written before the hook ran (or without it): keep a fresh state
    if updates is None:
        return
    names = [str(n) for n in numpy.asarray(serializer('names', None)).reshape(-1)]
    qs = _unpack(numpy.asarray(serializer('q', None)), numpy.asarray(serializer('q_shapes', None)))
    e_names = [str(n) for n in numpy.asarray(serializer('error_names', None)).reshape(-1)]
    errs = _unpack(numpy.asarray(serializer[RANK_MEAN]('error', None)),
                   numpy.asarray(serializer('error_shapes', None)))
    loaded = {n: [q, None] for n, q in zip(names, qs)}
    for n, e in zip(e_names, errs):
        loaded.setdefault(n, [None, None])[1] = e
    hook.updates = int(numpy.asarray(updates))
    hook._loaded = {n: tuple(v) for n, v in loaded.items()}
    hook._q, hook._error, hook._plans = {}, {}, {}
