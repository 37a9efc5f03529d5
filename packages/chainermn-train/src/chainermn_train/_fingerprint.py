"""Notice when the ranks' copies of a model differ (e.g. a plain optimizer on a multi-process job).

When the multi-node evaluator or the checkpointer runs, every rank sums each parameter (and its
squares) in float64 and the ranks allgather these few numbers once; if the ranks hold the same
parameter names and shapes but different values, :class:`ParameterMismatchWarning` is warned once
per process (every rank warns, rank 0 shows it), naming the first differing parameter and the
likely cause.  Ranks that hold different parameters (model parallelism) are not compared.
"""

import zlib

import numpy

from chainermn_comm import voice

from chainermn_train import _params

__all__ = ['ParameterMismatchWarning', 'fingerprint', 'check_same_parameters', 'model_of']

# Relative difference of the sums above which two ranks' parameters count as different: ranks of
# a multi-node optimizer hold bitwise-equal parameters, ranks that train apart differ by far more.
_RTOL = 1e-6
_warned = False   # once per process


class ParameterMismatchWarning(UserWarning):
    """Warned when ranks that should hold the same model hold different parameter values."""


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
