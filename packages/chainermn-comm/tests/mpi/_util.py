"""Helpers shared by the per-rank test files (deterministic data, expected topology)."""

import functools
import math
import os

import numpy

__all__ = ['NUMERIC', 'SENDABLE', 'make', 'assert_same', 'contig', 'expected_topology', 'reduce_expected',
           'round_once', 'half_mean_expected', 'to_bf16', 'from_bf16', 'bf16_mean_expected']

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


def round_once(terms):
    """Add float16 ``terms`` in float32 in the order given and round once to float16."""
    total = terms[0].astype(numpy.float32)
    for t in terms[1:]:
        total = total + t.astype(numpy.float32)
    return total.astype(numpy.float16)


def half_mean_expected(per_rank, nodes=None):
    """Return the float16-wire average of ``per_rank`` (one array per rank) bit for bit.

    ``nodes`` (lists of ranks) share memory: each node adds its ranks' values in float32 in
    rank order.  None means every rank is a node of its own (the MPI-only path).  One node
    sends nothing: its sum times ``1/size`` is the result.  With several nodes the ranks
    agree on a power of two ``2**e`` that puts the largest ``|value|`` just below
    ``2**TOP_EXP``; each node sends ``float16(sum * 2**e / size)``; the nodes' terms are
    added in float32 and rounded once (not at all with two nodes: ``reduce.half``'s one phase);
    the result is multiplied by ``2**-e`` in float32.
    """
    from chainermn_comm.reduce.half import MAX_EXP, MIN_EXP, TOP_EXP
    size = len(per_rank)
    dtype = per_rank[0].dtype
    if nodes is None:
        nodes = [[q] for q in range(size)]
    partial = []
    for node in nodes:
        total = per_rank[node[0]].astype(numpy.float32)
        for q in node[1:]:
            total = total + per_rank[q].astype(numpy.float32)
        partial.append(total)
    if len(nodes) == 1:
        return (partial[0] * numpy.float32(1.0 / size)).astype(dtype)
    m = max((float(numpy.abs(x.astype(numpy.float64)).max()) for x in per_rank if x.size), default=0.0)
    e = MAX_EXP if m == 0.0 else min(MAX_EXP, max(MIN_EXP, TOP_EXP - math.frexp(m)[1]))
    up = numpy.float32(math.ldexp(1.0 / size, e))
    terms = [(p * up).astype(numpy.float16) for p in partial]
    total = round_once(terms) if len(terms) > 2 else terms[0].astype(numpy.float32) + terms[1]
    return (total.astype(numpy.float32) * numpy.float32(math.ldexp(1.0, -e))).astype(dtype)


def to_bf16(x):
    """Round values (cast to float32 first) to bfloat16 words: nearest, ties to even; NaN to 0x7FC0 | sign."""
    x = numpy.ascontiguousarray(x, dtype=numpy.float32)
    u = x.view(numpy.uint32).astype(numpy.uint64)
    words = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(numpy.uint16)
    nan = numpy.isnan(x)
    words[nan] = ((u[nan] >> 16) & 0x8000 | 0x7FC0).astype(numpy.uint16)
    return words


def from_bf16(words):
    """Return the float32 values of bfloat16 words."""
    return (numpy.asarray(words, dtype=numpy.uint16).astype(numpy.uint32) << 16).view(numpy.float32)


def bf16_mean_expected(per_rank, nodes=None):
    """Return the bfloat16-wire average of ``per_rank`` (one array per rank) bit for bit.

    ``nodes`` as in :func:`half_mean_expected`.  Each node's float32 sum (each rank's value
    alone when None) is rounded to bfloat16; the terms are added in float32 in node order,
    multiplied by ``float32(1/size)``, rounded to bfloat16 once more (not with two nodes:
    ``reduce.half``'s one phase) and widened.  One node sends nothing: its float32 sum times
    ``1/size`` is the result.
    """
    size = len(per_rank)
    dtype = per_rank[0].dtype
    if nodes is None:
        nodes = [[q] for q in range(size)]
    partial = []
    for node in nodes:
        total = per_rank[node[0]].astype(numpy.float32)
        for q in node[1:]:
            total = total + per_rank[q].astype(numpy.float32)
        partial.append(total)
    scale = numpy.float32(1.0 / size)
    if len(nodes) == 1:
        return (partial[0] * scale).astype(dtype)
    total = from_bf16(to_bf16(partial[0]))
    for p in partial[1:]:
        total = total + from_bf16(to_bf16(p))
    total = total * scale
    if len(nodes) > 2:
        total = from_bf16(to_bf16(total))
    return total.reshape(per_rank[0].shape).astype(dtype)
