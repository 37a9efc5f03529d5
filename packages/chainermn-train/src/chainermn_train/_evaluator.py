"""create_multi_node_evaluator: make an Evaluator return what Chainer's returns over all ranks' batches.

Chainer's ``Evaluator.evaluate`` adds each batch's observation to a ``DictSummary``: every value
reported for a key counts with weight 1 (or the weight of a ``(value, weight)`` tuple), and the
result is ``sum(weight * value) / sum(weight)`` per key.  While the patched ``evaluate`` runs, the
evaluation function (``eval_func``, or the target) is wrapped so that, after each call, the weight
each key received in the current observation is added up the same way; each rank's mean times its
weight is its share of the sum.  The ranks allgather ``(mean, weight)`` per key once, so the result
is what Chainer's own evaluator returns in one process over every rank's batches, whatever a batch
is (a list of examples, a tuple or dict of arrays) and however unevenly the data was cut.

A key that no observation held (a subclass's ``evaluate`` that computes it itself) is weighted by
the number of examples the rank's iterators yielded (:func:`examples_in`), or 1 when none.

Mistakes are found before any batch is drawn and reported once, by rank 0, on every rank together
(the problems ride with the results' allgather): an iterator that repeats (``repeat=True``, or,
with Chainer's own ``evaluate``, an iterator that starts a second pass instead of stopping), an
iterator or data set that is ``None`` (only rank 0 loaded the data).  Each evaluation also
compares a fingerprint of the target's parameters across ranks (see ``_fingerprint``).
"""

import copy
import types

import numpy

from chainermn_comm import trace, voice
from chainermn_train import _fingerprint, _trainer_run

__all__ = ['create_multi_node_evaluator', 'examples_in']

_UNSET = object()


def examples_in(batch):
    """Return the number of examples in ``batch``: a list's length, or a column's length for a tuple or dict of arrays."""
    columns = None
    if isinstance(batch, dict):
        columns = list(batch.values())
    elif isinstance(batch, tuple):
        columns = list(batch)
    if columns:
        lengths = {_leading(c) for c in columns}
        if None not in lengths and len(lengths) == 1:
            return lengths.pop()   # columns of one batch (word2vec's (center, context))
        if isinstance(batch, dict):
            return 1
    n = _leading(batch)
    if n is not None:
        return n
    try:
        return len(batch)
    except TypeError:
        return 1


def _leading(value):
    shape = getattr(value, 'shape', None)
    if shape is not None and len(shape) >= 1:
        return int(shape[0])
    return None


def _weights_of(observation, weights):
    """Add the weight each key of ``observation`` gets in Chainer's ``DictSummary.add`` to ``weights``."""
    for key, value in observation.items():
        w = 1.0
        if isinstance(value, tuple):
            value, w = value[0], value[1]
            w = _as_float(getattr(w, 'array', w))
            if w is None:
                continue   # Chainer raises here: the local evaluate fails the same way
        value = getattr(value, 'array', value)
        if numpy.isscalar(value) or getattr(value, 'ndim', -1) == 0:
            weights[key] = weights.get(key, 0.0) + w


class _Watch:
    """What one rank saw during one evaluation: examples, per-key weights, a repeating iterator."""

    def __init__(self, check_repeat):
        self.examples = 0
        self.weights = {}
        self.check_repeat = check_repeat
        self.repeated = None   # the name of an iterator that began a second pass
        self.last = None


class _CountingIterator:
    """Delegate to an iterator; count its examples and stop it when it starts a second pass."""

    def __init__(self, iterator, watch, name):
        self.__dict__.update(_mn_iterator=iterator, _mn_watch=watch, _mn_name=name, _mn_epoch=_UNSET)

    def __iter__(self):
        return self

    def __next__(self):
        it, watch = self._mn_iterator, self._mn_watch
        before = getattr(it, 'epoch', None)
        if self._mn_epoch is _UNSET:
            self.__dict__['_mn_epoch'] = before
        batch = next(it)
        start = self._mn_epoch
        if (watch.check_repeat and isinstance(before, int) and isinstance(start, int)
                and before > start):
            # The pass had ended (epoch went up) and the iterator gave another batch instead of
            # StopIteration: Chainer's evaluate would never end.  Stop here; evaluate reports it.
            watch.repeated = self._mn_name
            raise StopIteration
        watch.examples += examples_in(batch)
        return batch

    next = __next__

    def __copy__(self):
        return _CountingIterator(copy.copy(self._mn_iterator), self._mn_watch, self._mn_name)

    def __getattr__(self, name):
        return getattr(self.__dict__['_mn_iterator'], name)

    def __setattr__(self, name, value):
        setattr(self._mn_iterator, name, value)


def _counting_eval_func(func, watch):
    """Wrap ``func``: after each call, add the weights of the current observation (one batch's)."""
    def counted(*args, **kwargs):
        out = func(*args, **kwargs)
        import chainer
        observation = getattr(chainer.reporter.get_current_reporter(), 'observation', None)
        if isinstance(observation, dict) and observation is not watch.last:
            watch.last = observation
            _weights_of(observation, watch.weights)
        return out
    return counted


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


def _describe(name, it):
    return 'iterator {!r} ({})'.format(name, type(it).__name__)


def _problems(evaluator, own_loop):
    """Return what is wrong with this rank's iterators before any batch is drawn, or None."""
    iterators = getattr(evaluator, '_iterators', None) or {}
    for name, it in iterators.items():
        if it is None:
            return ('the evaluator\'s iterator {!r} is None on this rank: only rank 0 loaded the '
                    'data set. Load it on rank 0 and give every rank its shard with '
                    'chainermn.scatter_dataset(dataset, comm) (the other ranks pass None), then make '
                    'each rank\'s iterator over its shard'.format(name))
        if getattr(it, 'dataset', _UNSET) is None:
            return ('the evaluator\'s {} iterates over dataset=None on this rank: only rank 0 loaded '
                    'the data set. Load it on rank 0 and give every rank its shard with '
                    'test = chainermn.scatter_dataset(test, comm) (the other ranks pass None), then '
                    'make each rank\'s iterator over its shard'.format(_describe(name, it)))
    if own_loop:
        for name, it in iterators.items():
            if getattr(it, 'repeat', False) is True:
                return ('the evaluator\'s {} has repeat=True, so the evaluation would never end: '
                        'create it with repeat=False (e.g. SerialIterator(test, batch_size, '
                        'repeat=False, shuffle=False))'.format(_describe(name, it)))
    return None


def _empty(evaluator):
    """Return True when the main iterator's data set holds no example."""
    dataset = getattr(evaluator._iterators.get('main'), 'dataset', None)
    try:
        return dataset is not None and len(dataset) == 0
    except TypeError:
        return False


def _combine(gathered):
    """Return ``{key: (mean, dtype)}`` over ranks of ``[(examples, {key: (mean, weight, dtype)})]``."""
    keys = []
    for _, res in gathered:
        for k in res:
            if k not in keys:
                keys.append(k)
    out = {}
    for k in keys:
        num, den, dtype, seen = 0.0, 0.0, None, False
        for examples, res in gathered:
            if k not in res or res[k][0] is None:
                continue
            mean, weight, kind = res[k]
            w = weight if weight is not None else float(examples if examples > 0 else 1)
            num += w * mean
            den += w
            dtype, seen = dtype or kind, True
        if seen:
            out[k] = (num / den if den else float('nan'), dtype)
    return out


def _mn_evaluate(self):
    with trace.span('evaluate', 'eval'):
        return _evaluate_all(self)


def _evaluate_all(self):
    comm = self._mn_communicator
    import chainer
    own_loop = getattr(type(self), 'evaluate', None) is chainer.training.extensions.Evaluator.evaluate
    problem = _problems(self, own_loop)
    watch = _Watch(own_loop)
    local = {}
    if problem is None and own_loop and _empty(self):
        pass   # a shard with no example (n < ranks): no batch, and SerialIterator would divide by 0
    elif problem is None:
        iterators = self._iterators
        originals = dict(iterators)
        eval_func = self.eval_func
        for name, it in originals.items():
            iterators[name] = _CountingIterator(it, watch, name)
        self.eval_func = _counting_eval_func(eval_func or self._targets['main'], watch)
        try:
            local = self._mn_original_evaluate()
        finally:
            self.eval_func = eval_func
            for name, it in originals.items():
                iterators[name] = it
        local = local if local is not None else {}
        if watch.repeated is not None:
            problem = ('the evaluator\'s {} began a second pass instead of raising StopIteration at '
                       'the end of its data, so the evaluation would never end: give it '
                       'repeat=False (a custom iterator must raise StopIteration after one pass when '
                       'repeat=False)'.format(_describe(watch.repeated, originals[watch.repeated])))
            local = {}
    target = getattr(self, '_targets', {}).get('main')
    if hasattr(target, 'namedparams'):
        _fingerprint.check_same_parameters(comm, target, 'the multi-node evaluator')
    mine = {}
    for k, v in local.items():
        dtype = getattr(v, 'dtype', None)
        mine[k] = (_as_float(v), watch.weights.get(k),
                   dtype.str if dtype is not None and dtype.kind == 'f' else None)
    gathered = comm.allgather_obj((problem, watch.examples, mine))
    bad = [(r, p) for r, (p, _, _) in enumerate(gathered) if p is not None]
    if bad:
        raise voice.agreed(ValueError('rank {}: the multi-node evaluator cannot evaluate: {}'.format(
            comm.rank, '; '.join('rank {}: {}'.format(r, p) for r, p in bad))), comm)
    combined = _combine([(n, res) for _, n, res in gathered])
    self._mn_last_counts = [n for _, n, _ in gathered]
    self._mn_last_weights = [{k: w for k, (_, w, _) in res.items()} for _, _, res in gathered]
    return {k: numpy.asarray(v, dtype=numpy.dtype(dtype) if dtype else numpy.float64)
            for k, (v, dtype) in combined.items()}


def create_multi_node_evaluator(actual_evaluator, communicator):
    """Patch ``actual_evaluator`` so that ``evaluate`` returns Chainer's result over all ranks' batches.

    The value of each key is what ``chainer.training.extensions.Evaluator`` returns in one process
    over the batches of every rank: the mean of the values reported for it, each with weight 1
    (or the weight of a reported ``(value, weight)`` tuple), so each batch counts once whatever
    its size or type.  Works for subclasses that override ``evaluate`` (a key no observation held
    is weighted by the rank's number of examples).  The iterators must stop after one pass
    (``repeat=False``).  Adds attributes starting with ``_mn_``; every rank must call ``evaluate``
    (it is a collective).

    Returns:
        The patched ``actual_evaluator``.
    """
    _trainer_run.install()
    if getattr(actual_evaluator, '_mn_communicator', None) is not None:
        raise ValueError('this evaluator is already a multi-node evaluator; patch it only once')
    actual_evaluator._mn_communicator = communicator
    actual_evaluator._mn_original_evaluate = actual_evaluator.evaluate
    actual_evaluator._mn_last_counts = None
    actual_evaluator._mn_last_weights = None
    actual_evaluator.evaluate = types.MethodType(_mn_evaluate, actual_evaluator)
    return actual_evaluator
