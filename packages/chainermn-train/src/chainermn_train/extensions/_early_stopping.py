"""MultiNodeEarlyStoppingTrigger: early stopping decided on every rank from the mean over ranks."""

import operator

import numpy
from chainer.training import util as trigger_util
from chainermn_comm import voice
from chainermn_comm.log import get_logger

from chainermn_train.extensions._host import to_host

__all__ = ['MultiNodeEarlyStoppingTrigger']

_log = get_logger('train')


class MultiNodeEarlyStoppingTrigger:
    """Stop trigger that ends training on every rank at the same iteration.

    Like :class:`chainer.training.triggers.EarlyStoppingTrigger`: each rank averages the values of
    ``monitor`` it observed since the last check; when ``check_trigger`` fires the ranks' averages
    are averaged over the ranks that observed the key, and training stops once that mean has not
    improved on the best one for ``patience`` checks in a row, or when ``max_trigger`` fires.
    ``mode`` is ``'max'``, ``'min'`` or ``'auto'`` (``'max'`` when ``monitor`` contains
    ``'accuracy'``). ``verbose=True`` logs the stop on rank 0 (INFO, logger ``chainermn.train``).
    Collective: use it as the stop trigger of every rank's trainer.
    """

    def __init__(self, comm, check_trigger=(1, 'epoch'), monitor='main/loss', patience=3, mode='auto',
                 verbose=False, max_trigger=(100, 'epoch')):
        if mode not in ('auto', 'max', 'min'):
            raise ValueError("mode must be 'auto', 'max' or 'min'; got {!r}".format(mode))
        if isinstance(patience, bool) or not isinstance(patience, (int, numpy.integer)) or patience < 0:
            raise ValueError('patience must be a non-negative int (checks without improvement); '
                             'got {!r}'.format(patience))
        self.comm = comm
        self.monitor = monitor
        self.patience = int(patience)
        self.verbose = verbose
        self.count = 0
        self._interval_trigger = trigger_util.get_trigger(check_trigger)
        self._max_trigger = trigger_util.get_trigger(max_trigger)
        maximize = mode == 'max' or (mode == 'auto' and 'accuracy' in monitor)
        self._compare = operator.gt if maximize else operator.lt
        self.best = float('-inf') if maximize else float('inf')
        self._sum = 0.0
        self._n = 0

    def __call__(self, trainer):
        """Return True when training should stop (the same answer on every rank)."""
        observation = trainer.observation
        if self.monitor in observation:
            self._sum += float(numpy.mean(to_host(observation[self.monitor])))
            self._n += 1
        if self._max_trigger(trainer):
            return True
        if not self._interval_trigger(trainer):
            return False
        local = numpy.array([self._sum / self._n, 1.0] if self._n else [0.0, 0.0])
        self._sum, self._n = 0.0, 0
        total, ranks = self.comm.allreduce_obj(local)
        if not ranks:
            voice.warn_all('{} is not in the observation of any rank; early stopping cannot '
                           'decide'.format(self.monitor), UserWarning, self.comm.rank, stacklevel=2)
            return False
        current = total / ranks
        if self._compare(current, self.best):
            self.best = current
            self.count = 0
        else:
            self.count += 1
        if self.count >= self.patience:
            if self.verbose and self.comm.rank == 0:
                _log.info('Epoch %s: early stopping (%s = %s over %d ranks; best %s)',
                          trainer.updater.epoch, self.monitor, current, int(ranks), self.best)
            return True
        return False

    def get_training_length(self):
        """Return ``(length, unit)`` of ``max_trigger`` (what the progress bar shows)."""
        return (self._max_trigger.period, self._max_trigger.unit)
