"""``chainermn.extensions.observation_aggregator`` (v7's path): ``ObservationAggregator``."""

from chainermn_train.extensions import ObservationAggregator

__all__ = ['ObservationAggregator']
