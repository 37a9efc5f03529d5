"""GenericMultiNodeEvaluator: evaluate locally on every rank, aggregate all results on one rank."""

import copy

import chainer
from chainer import backend
from chainer.dataset import convert
from chainer.training import extension

__all__ = ['GenericMultiNodeEvaluator']

#: Batches each rank evaluates between two gathers of the results on root.
GATHER_INTERVAL = 8


def _convert(converter, batch, device):
    call = getattr(convert, '_call_converter', None)  # new- and old-style converters (Chainer >= 7)
    if call is not None:
        return call(converter, batch, device)
    return converter(batch, device)


class GenericMultiNodeEvaluator(extension.Extension):
    """Evaluator for results that cannot be averaged: every result is brought to ``root``.

    Each rank runs ``calc_local`` on the batches of its own ``iterator`` (which must not repeat);
    ``root`` collects what it returned from all ranks, one batch round at a time (the results of
    round k in rank order, then round k + 1, ...), and passes the list to ``aggregate`` once per
    call. Override both: ``calc_local(*in_arrays)`` (``**in_arrays`` for dict batches) computes
    anything picklable from one converted batch, by default ``target(*in_arrays)``;
    ``aggregate(results)`` runs on ``root`` only and may report values, by default it returns the
    list. ``__call__`` returns what ``aggregate`` returned on ``root`` and None elsewhere.
    ``calc_local`` runs in ``no_backprop_mode``; ``progress_hook(batch)`` is called on ``root`` for
    each of its batches. Collective: register it on every rank with the same trigger.
    """

    trigger = 1, 'epoch'
    default_name = 'validation'
    priority = extension.PRIORITY_WRITER
    name = None

    def __init__(self, comm, iterator, target, device=None, converter=convert.concat_examples, root=0,
                 progress_hook=None):
        if isinstance(root, bool) or not isinstance(root, int) or not 0 <= root < comm.size:
            raise ValueError('rank {}: root must be a rank in [0, {}); got {!r}'.format(
                comm.rank, comm.size, root))
        if getattr(iterator, 'repeat', False):
            raise ValueError('rank {}: GenericMultiNodeEvaluator needs an iterator that stops at the '
                             'end of the data (e.g. SerialIterator(..., repeat=False)); this one '
                             'repeats forever'.format(comm.rank))
        self.comm = comm
        self.iterator = iterator
        self._targets = {'main': target}
        self.converter = converter
        self.device = None if device is None else backend.get_device(device)
        self.root = root
        self._progress_hook = progress_hook

    def get_target(self, name='main'):
        """Return the target link (``'main'``)."""
        return self._targets[name]

    def __call__(self, trainer=None):
        """Evaluate on every rank; return ``aggregate``'s result on ``root``, None elsewhere."""
        if hasattr(self.iterator, 'reset'):
            self.iterator.reset()
            it = self.iterator
        else:
            it = copy.copy(self.iterator)
        results = self._collect(it)
        if self.comm.rank != self.root:
            return None
        return self.aggregate(results)

    def calc_local(self, *args, **kwargs):
        """Compute this rank's result for one converted batch (default: call the target)."""
        return self._targets['main'](*args, **kwargs)

    def aggregate(self, results):
        """Combine the results of all ranks on ``root`` (default: return the list as it is)."""
        return results

    # -- internals ---------------------------------------------------------------
    def _local_round(self, it):
        """Evaluate up to GATHER_INTERVAL batches; return (results, exhausted)."""
        results = []
        for _ in range(GATHER_INTERVAL):
            try:
                batch = next(it)
            except StopIteration:
                return results, True
            in_arrays = _convert(self.converter, batch, self.device)
            with chainer.no_backprop_mode():
                if isinstance(in_arrays, tuple):
                    results.append(self.calc_local(*in_arrays))
                elif isinstance(in_arrays, dict):
                    results.append(self.calc_local(**in_arrays))
                else:
                    results.append(self.calc_local(in_arrays))
            if self._progress_hook is not None and self.comm.rank == self.root:
                self._progress_hook(batch)
        return results, False

    def _collect(self, it):
        """Return every rank's results on root (round by round, rank order), None elsewhere."""
        collected = [] if self.comm.rank == self.root else None
        done = False
        while not done:
            failure = None
            try:
                mine, exhausted = self._local_round(it)
            except Exception as e:
                failure = e
                mine, exhausted = None, True
            error = None if failure is None else '{}: {}'.format(type(failure).__name__, failure)
            rounds = self.comm.gather_obj((mine, exhausted, error), root=self.root)
            status = None
            if self.comm.rank == self.root:
                errors = ['rank {}: {}'.format(r, e) for r, (_, _, e) in enumerate(rounds) if e]
                if errors:
                    status = 'failed: ' + '; '.join(errors)
                else:
                    for k in range(max(len(m) for m, _, _ in rounds)):
                        collected.extend(m[k] for m, _, _ in rounds if k < len(m))
                    status = 'done' if all(x for _, x, _ in rounds) else 'more'
            status = self.comm.bcast_obj(status, root=self.root)
            if failure is not None:
                raise failure
            if status.startswith('failed'):
                raise RuntimeError('rank {}: evaluation {}'.format(self.comm.rank, status))
            done = status == 'done'
        return collected
