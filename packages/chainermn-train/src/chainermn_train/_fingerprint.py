"""Notice when the ranks' copies of a model differ, or when the ranks train on the same batches.

When the multi-node evaluator or the checkpointer runs, every rank sums each parameter (and its
squares) in float64 and the ranks allgather these few numbers once; if the ranks hold the same
parameter names and shapes but different values, :class:`ParameterMismatchWarning` is warned once
per process (every rank warns, rank 0 shows it), naming the first differing parameter and the
likely cause.  Ranks that hold different parameters (model parallelism) are not compared.

At the first update of a multi-node optimizer, a digest of each rank's batch (:func:`batch_digest`)
rides with the batch-size check's allgather; ranks of that communicator whose batches are
identical (no ``scatter_dataset``, or every rank shuffling with the same seed) draw
:class:`IdenticalBatchesWarning`, once per process, shown by the communicator's rank 0.  Ranks
that share batches over another communicator (a model-parallel group) are never compared.
"""

import hashlib
import zlib

import numpy

from chainermn_comm import voice

from chainermn_train import _params

__all__ = ['ParameterMismatchWarning', 'IdenticalBatchesWarning', 'fingerprint', 'check_same_parameters',
           'model_of', 'batch_digest', 'warn_identical_batches']

# Relative difference of the sums above which two ranks' parameters count as different: ranks of
# a multi-node optimizer hold bitwise-equal parameters, ranks that train apart differ by far more.
_RTOL = 1e-6
_warned = False   # once per process
_warned_batches = False   # once per process


class ParameterMismatchWarning(UserWarning):
    """Warned when ranks that should hold the same model hold different parameter values."""


class IdenticalBatchesWarning(UserWarning):
    """Warned when ranks of a multi-node optimizer feed identical batches to its first update."""


def _to_host(array):
    get = getattr(array, 'get', None)   # CuPy
    return numpy.asarray(get() if get is not None and not isinstance(array, numpy.ndarray) else array)


def fingerprint(link):
    """Return ``(signature, sums)``: the parameters' names/shapes/dtypes and a float64 (n, 2) array."""
    sig = _params.param_signature(link)
    sums = numpy.zeros((len(sig), 2), numpy.float64)
    for i, (_, p) in enumerate(_params.sorted_params(link)):
        if p.array is not None:
            a = _to_host(p.array).astype(numpy.float64, copy=False).ravel()
            sums[i] = a.sum(), numpy.dot(a, a)
    return sig, sums


def _first_difference(sig, all_sums):
    """Return ``(index, {rank: (sum, sumsq)})`` of the first parameter the ranks disagree on, or None."""
    ref = all_sums[0]
    for i in range(len(sig)):
        for s in all_sums[1:]:
            scale = numpy.maximum(numpy.abs(ref[i]), numpy.abs(s[i]))
            if numpy.any(numpy.abs(ref[i] - s[i]) > _RTOL * scale) or not numpy.array_equal(
                    numpy.isnan(ref[i]), numpy.isnan(s[i])):
                return i, {r: tuple(float(x) for x in sums[i]) for r, sums in enumerate(all_sums)}
    return None


def check_same_parameters(comm, link, who):
    """Warn once (from rank 0) when the ranks of ``comm`` hold different values of ``link``'s parameters.

    Collective on ``comm`` (one small allgather) every time it is called, also after it warned, so
    that every rank takes part identically.  Returns the path of the first differing parameter,
    or None (equal, a single rank, or ranks with different parameter names/shapes).
    """
    global _warned
    if comm.size < 2:
        return None
    sig, sums = fingerprint(link)
    key = zlib.crc32(repr(sig).encode())   # the signature itself could be long: send its checksum
    gathered = comm.allgather_obj((key, sums))
    if any(k != key for k, _ in gathered):
        return None   # the ranks hold different parts of a model: nothing to compare
    diff = _first_difference(sig, [s for _, s in gathered])
    if diff is None:
        return None
    index, per_rank = diff
    name = sig[index][0]
    if not _warned:
        _warned = True
        # Every rank warns (the filters act alike everywhere: 'error' raises on every rank); rank
        # 0 shows it.
        voice.warn_all(
            'the {} ranks hold different values of the same model: parameter {} first differs '
            '(sum, sum of squares per rank: {}), found by {}. Likely cause: the optimizer is not a '
            'multi-node optimizer (wrap it with chainermn.create_multi_node_optimizer(optimizer, '
            'comm)), so every rank trains its own copy; or the parameters were changed on one rank '
            'only (e.g. a snapshot loaded on one rank). This warning is shown once per '
            'process.'.format(comm.size, name, ', '.join(
                'rank {}: ({:.6g}, {:.6g})'.format(r, *v) for r, v in sorted(per_rank.items())), who),
            ParameterMismatchWarning, comm.rank, stacklevel=3)
    return name


def model_of(obj):
    """Return the link the main optimizer of a Trainer (or an updater) trains, or None."""
    updater = getattr(obj, 'updater', obj)
    get = getattr(updater, 'get_optimizer', None)
    if get is None:
        return None
    try:
        optimizer = get('main')
    except Exception:
        return None
    target = getattr(optimizer, 'target', None)
    return target if hasattr(target, 'namedparams') else None


def batch_digest(batch):
    """Return a hex digest of the arrays in ``batch`` (arrays, Variables, lists, tuples, dicts), or None.

    None when the batch holds no array element (e.g. ``create_empty_dataset``'s empty tuples, an
    update without a batch): there is nothing to compare.
    """
    h = hashlib.blake2b(digest_size=16)
    try:
        if not _feed(h, batch):
            return None
    except Exception:   # an array type that cannot reach the host: nothing to compare
        return None
    return h.hexdigest()


def _feed(h, value):
    """Add ``value`` to ``h``; return True when it held at least one array element."""
    value = getattr(value, 'array', value)   # a Variable
    if isinstance(value, dict):
        found = False
        for k in sorted(value, key=repr):
            h.update(repr(k).encode())
            found = _feed(h, value[k]) or found
        return found
    if isinstance(value, (list, tuple)):
        h.update(b'(%d' % len(value))
        found = False
        for v in value:
            found = _feed(h, v) or found
        return found
    if hasattr(value, 'shape') and hasattr(value, 'dtype'):
        a = numpy.ascontiguousarray(_to_host(value))
        h.update('{}{}'.format(a.dtype.str, a.shape).encode())
        h.update(a.view(numpy.uint8).reshape(-1) if a.size else b'')
        return a.size > 0
    if isinstance(value, (int, float, complex, str, bytes, bool, numpy.generic)) or value is None:
        h.update(repr(value).encode())
    return False


def warn_identical_batches(comm, digests):
    """Warn once (from rank 0 of ``comm``) when ranks of ``comm`` fed identical first batches.

    ``digests`` are the ranks' :func:`batch_digest` values, gathered by the caller's exchange (no
    collective here).  Returns the groups of ranks with identical batches.
    """
    global _warned_batches
    groups = {}
    for r, d in enumerate(digests):
        if d is not None:
            groups.setdefault(d, []).append(r)
    same = [ranks for ranks in groups.values() if len(ranks) > 1]
    if not same or _warned_batches:
        return same
    _warned_batches = True
    voice.warn_all(
        'ranks {} of the multi-node optimizer\'s communicator ({} ranks) fed identical batches to its '
        'first update: they train on the same examples in the same order, so their gradients add '
        'nothing to each other. Load the data set on rank 0 and give every rank its own shard: '
        'train = chainermn.scatter_dataset(train, comm, shuffle=True, seed=0) (the other ranks pass '
        'None). If every rank must hold the whole data set, shuffle it differently on each rank '
        '(SerialIterator(train, batch_size, shuffle=True) with numpy.random seeded by rank, e.g. '
        'numpy.random.seed(seed + comm.rank)). This warning is shown once per process.'.format(
            '; '.join(', '.join(str(r) for r in ranks) for ranks in same), comm.size),
        IdenticalBatchesWarning, comm.rank, stacklevel=3)
    return same
