"""``chainermn.extensions._multi_node_snapshot``: the private module path v7's own tests import.

Chainer v7's ``extensions_tests/test_multi_node_snapshot.py`` does ``from chainermn.extensions
import _multi_node_snapshot`` and calls ``_parse_replica_sets`` (its result: a list of sets).
"""

from chainermn_train.checkpoint import multi_node_snapshot, parse_replica_sets

__all__ = ['multi_node_snapshot']


def _parse_replica_sets(replica_sets, size):
    """Return the replica sets as v7 did: a list of sets of ranks (the rest is one more set)."""
    return [set(ranks) for ranks in parse_replica_sets(replica_sets, size)]
