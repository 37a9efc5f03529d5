"""ObservationAggregator, MultiNodeEarlyStoppingTrigger, GenericMultiNodeEvaluator, multi_node_snapshot."""

import os

import pytest

from chainermn_comm.testing import run_pytest_under_mpi
from chainermn_train.checkpoint._multi_node_snapshot import parse_replica_sets

HERE = os.path.dirname(__file__)


@pytest.mark.parametrize('n', [1, 2, 3])
def test_later_extensions(n):
    run_pytest_under_mpi(os.path.join(HERE, 'mpi', 'mpi_later_extensions.py'), n, timeout=300)


@pytest.mark.parametrize('sets,size,want', [
    ([0], 4, [[0], [1, 2, 3]]),
    ([0, 1], 4, [[0], [1], [2, 3]]),
    ([[0, 1], [2, 3]], 4, [[0, 1], [2, 3]]),
    ([], 4, [[0, 1, 2, 3]]),
    ([range(0, 8, 2), range(1, 8, 2)], 8, [[0, 2, 4, 6], [1, 3, 5, 7]]),
    ([{3, 1}], 4, [[1, 3], [0, 2]]),
    ([0], 1, [[0]]),
])
def test_replica_sets(sets, size, want):
    assert parse_replica_sets(sets, size) == want


@pytest.mark.parametrize('sets,match', [([0, [0, 1]], 'appears'), ([4], 'ranks are 0..3'),
                                        ([[1, -1]], 'ranks are'), ([['a']], 'ranks are')])
def test_replica_sets_errors(sets, match):
    with pytest.raises(ValueError, match=match):
        parse_replica_sets(sets, 4)
