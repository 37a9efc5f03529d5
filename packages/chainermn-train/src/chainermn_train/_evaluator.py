"""create_multi_node_evaluator: make an Evaluator report the example-weighted mean over all ranks.

While the patched ``evaluate`` runs, each of the evaluator's iterators is wrapped in a proxy that
counts the examples of every batch it yields (``len(batch)``).  The results of all ranks are then
combined as ``sum_r n_r * v_r / sum_r n_r`` where ``n_r`` is the number of examples rank ``r``
evaluated.  When a rank's iterators yielded nothing countable, its weight is 1 (plain mean).
Each evaluation also compares a fingerprint of the target's parameters across ranks (see
``_fingerprint``): averaging the results of different models warns once.
"""

import copy
import types

import numpy

from chainermn_comm import trace
from chainermn_train import _fingerprint, _trainer_run

__all__ = ['create_multi_node_evaluator']


class _CountingIterator:
    """Delegate to an iterator and count the examples of the batches it yields."""

    def __init__(self, iterator, counter):
        self.__dict__['_mn_iterator'] = iterator
        self.__dict__['_mn_counter'] = counter

    def __iter__(self):
        return self

    def __next__(self):
        batch = next(self._mn_iterator)
        try:
            self._mn_counter[0] += len(batch)
        except TypeError:
            self._mn_counter[0] += 1
        return batch

    next = __next__

    def __copy__(self):
        return _CountingIterator(copy.copy(self._mn_iterator), self._mn_counter)

    def __getattr__(self, name):
        return getattr(self.__dict__['_mn_iterator'], name)

    def __setattr__(self, name, value):
        setattr(self._mn_iterator, name, value)


def _as_float(value):
    try:
        import chainer
        value = chainer.backend.CpuDevice().send(value)
    except Exception:
        pass
    if isinstance(value, numpy.ndarray) and value.size != 1:
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _combine(gathered):
    """Weighted mean over ranks of ``[(count, {key: float})]``; keys missing on a rank are skipped."""
    keys = []
    for _, res in gathered:
        for k in res:
            if k not in keys:
                keys.append(k)
    out = {}
    for k in keys:
        num = 0.0
        den = 0.0
        for count, res in gathered:
            if k in res and res[k] is not None:
                w = float(count) if count > 0 else 1.0
                num += w * res[k]
                den += w
        if den > 0:
            out[k] = num / den
    return out


def _mn_evaluate(self):
    with trace.span('evaluate', 'eval'):
        return _evaluate_all(self)


def _evaluate_all(self):
    comm = self._mn_communicator
    counter = [0]
    iterators = self._iterators
    originals = dict(iterators)
    for name, it in originals.items():
        iterators[name] = _CountingIterator(it, counter)
    try:
        local = self._mn_original_evaluate()
    finally:
        for name, it in originals.items():
            iterators[name] = it
    local = local if local is not None else {}
    target = getattr(self, '_targets', {}).get('main')
    if hasattr(target, 'namedparams'):
        _fingerprint.check_same_parameters(comm, target, 'the multi-node evaluator')
    mine = {k: _as_float(v) for k, v in local.items()}
    gathered = comm.allgather_obj((counter[0], mine))
    combined = _combine(gathered)
    self._mn_last_counts = [c for c, _ in gathered]
    result = {}
    for k, v in combined.items():
        orig = local.get(k)
        dtype = getattr(orig, 'dtype', None)
        result[k] = numpy.asarray(v, dtype=dtype if dtype is not None and dtype.kind == 'f'
                                  else numpy.float64)
    return result


def create_multi_node_evaluator(actual_evaluator, communicator):
    """Patch ``actual_evaluator`` so that ``evaluate`` returns the mean of all ranks' results.

    The mean is weighted by the number of examples each rank evaluated, so uneven parts of a
    scattered dataset give the exact global value.  Works for subclasses of
    ``chainer.training.extensions.Evaluator`` that override ``evaluate``.  Adds attributes
    starting with ``_mn_``; every rank must call ``evaluate`` (it is a collective).

    Returns:
        The patched ``actual_evaluator``.
    """
    _trainer_run.install()
    if getattr(actual_evaluator, '_mn_communicator', None) is not None:
        raise ValueError('this evaluator is already a multi-node evaluator; patch it only once')
    actual_evaluator._mn_communicator = communicator
    actual_evaluator._mn_original_evaluate = actual_evaluator.evaluate
    actual_evaluator._mn_last_counts = None
    actual_evaluator.evaluate = types.MethodType(_mn_evaluate, actual_evaluator)
    return actual_evaluator
