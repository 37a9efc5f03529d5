"""Communication hooks across 2 nodes of the namespace cluster (issue 45).

The built-in hooks equal the communicators' own wires bit for bit, PowerSGD leaves the same bits on
every rank, and the optimizer trains to the same bits with ``comm_hook`` as with
``allreduce_grad_dtype``: the per-rank tests of comm and train, run over real links between nodes.
"""

import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PLUGIN = ['-m', 'pytest', '-q', '-p', 'no:cacheprovider', '-p', 'chainermn_comm.testing.mpi_plugin']
FILES = [os.path.join(ROOT, 'packages', 'chainermn-comm', 'tests', 'mpi', 'mpi_hooks.py'),
         os.path.join(ROOT, 'packages', 'chainermn-train', 'tests', 'mpi', 'mpi_hooks_train.py')]


@pytest.fixture(autouse=True)
def _real_nodes(monkeypatch):
    monkeypatch.delenv('CHAINERMN_RANKS_PER_NODE', raising=False)


@pytest.mark.parametrize('per_node', [1, 2])
def test_hooks_across_two_nodes(cluster2, per_node):
    res = cluster2.mpiexec(PLUGIN + FILES, ranks_per_node=per_node, timeout=420, cwd=ROOT)
    detail = 'status {} after {:.1f}s\n{}\n{}'.format(res.returncode, res.seconds, res.stdout[-6000:],
                                                      res.stderr[-6000:])
    assert res.returncode == 0 and not res.timed_out, detail
    assert res.stdout.count('CHAINERMN-RANK-PASSED') == 2 * per_node, detail
