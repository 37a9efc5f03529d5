"""ObservationAggregator: combine one observed value over all ranks and report the result."""

import chainer
import numpy
from chainer.training import extension
from chainer.training import util as trigger_util

from chainermn_train.extensions._host import to_host

__all__ = ['ObservationAggregator']


def _mean(histories):
    """Default aggregator: the mean of every value observed on every rank (elementwise for arrays)."""
    values = [v for history in histories for v in history]
    if not values:
        return None
    return numpy.mean(numpy.stack([numpy.asarray(v, dtype=numpy.float64) for v in values]), axis=0)


class ObservationAggregator(extension.Extension):
    """Aggregate an observed value over all ranks and report it under ``aggregated_key``.

    Every iteration it records ``trainer.observation[original_key]`` (when present); when
    ``comm_trigger`` fires, every rank's records since the last aggregation are gathered on rank 0,
    which applies ``aggregator`` to them (a list with one list of values per rank, in rank order;
    default: the mean of all values), and the result is reported on every rank. Values are moved to
    host memory first. Collective: register it on every rank with the same triggers.
    """

    trigger = 1, 'iteration'
    priority = extension.PRIORITY_EDITOR
    name = None

    def __init__(self, comm, original_key, aggregated_key=None, *, comm_trigger=(1, 'iteration'),
                 aggregator=None):
        self.comm = comm
        self.original_key = original_key
        self.aggregated_key = original_key if aggregated_key is None else aggregated_key
        self.comm_trigger = trigger_util.get_trigger(comm_trigger)
        self.aggregator = _mean if aggregator is None else aggregator
        self.observation_history = []

    def __call__(self, trainer):
        observation = trainer.observation
        if self.original_key in observation:
            self.observation_history.append(to_host(observation[self.original_key]))
        if not self.comm_trigger(trainer):
            return
        histories = self.comm.gather_obj(self.observation_history, root=0)
        self.observation_history = []
        outcome = None
        if self.comm.rank == 0 and any(histories):  # else nothing was observed anywhere
            try:
                outcome = ('ok', self.aggregator(histories))
            except Exception as e:
                outcome = ('error', '{}: {}'.format(type(e).__name__, e))
        outcome = self.comm.bcast_obj(outcome, root=0)
        if outcome is None:
            return
        if outcome[0] == 'error':
            raise RuntimeError('rank {}: the aggregator of ObservationAggregator({!r}) failed on rank 0: '
                               '{}'.format(self.comm.rank, self.original_key, outcome[1]))
        if outcome[1] is not None:
            chainer.reporter.report({self.aggregated_key: outcome[1]})
