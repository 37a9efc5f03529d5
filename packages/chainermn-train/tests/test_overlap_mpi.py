import os

import pytest

from chainermn_comm.testing import run_pytest_under_mpi

HERE = os.path.dirname(__file__)


@pytest.mark.parametrize('mode', ['thread', 'inline', 'end'])
@pytest.mark.parametrize('n', [1, 2, 3])
def test_overlap(n, mode):
    """Buckets averaged by a background thread, inline in backward, and after backward."""
    run_pytest_under_mpi(os.path.join(HERE, 'mpi', 'mpi_overlap.py'), n, timeout=240,
                         env={'CHAINERMN_OVERLAP_MODE': mode})


@pytest.mark.parametrize('mode', ['thread', 'inline'])
def test_overlap_two_simulated_nodes(mode):
    """Two nodes of two ranks: shared memory per node plus the cross-node all-reduce."""
    run_pytest_under_mpi(os.path.join(HERE, 'mpi', 'mpi_overlap.py'), 4, timeout=240,
                         env={'CHAINERMN_RANKS_PER_NODE': '2', 'CHAINERMN_OVERLAP_MODE': mode})
