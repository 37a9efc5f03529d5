"""CommunicatorBase.finalize() and the declared allreduce_grad(model, zero_fill) at 1, 2 and 3 ranks."""

import inspect
import os

import pytest

from chainermn_comm import CommunicatorBase, NaiveCommunicator
from chainermn_comm.testing import run_pytest_under_mpi

HERE = os.path.dirname(os.path.abspath(__file__))
LATER = os.path.join(HERE, 'mpi', 'mpi_later_comm_api.py')
FAKE = os.path.join(HERE, 'fakecupy')
GPU_COMMS = ('flat', 'pure_nccl', 'single_node', 'hierarchical', 'two_dimensional', 'non_cuda_aware')


@pytest.mark.parametrize('n', [1, 2, 3])
def test_naive(n):
    run_pytest_under_mpi(LATER, n, timeout=180)


def test_naive_debug_mode_and_two_simulated_nodes():
    res = run_pytest_under_mpi(LATER, 4, timeout=180,
                               env={'CHAINERMN_DEBUG': '1', 'CHAINERMN_RANKS_PER_NODE': '2'})
    assert 'passed' in res.stdout


@pytest.mark.parametrize('n,extra', [(1, {}), (2, {}), (3, {}), (4, {'CHAINERMN_RANKS_PER_NODE': '2'})],
                         ids=['1rank', '2ranks', '3ranks', '4ranks-2nodes'])
def test_gpu_communicators_on_the_stand_in(n, extra):
    names = GPU_COMMS if 'CHAINERMN_RANKS_PER_NODE' not in extra else tuple(
        c for c in GPU_COMMS if c != 'single_node')
    path = os.pathsep.join([FAKE] + [p for p in os.environ.get('PYTHONPATH', '').split(os.pathsep) if p])
    env = dict(extra, PYTHONPATH=path, CHAINERMN_TEST_LATER_COMMS=','.join(('naive',) + names),
               CHAINERMN_CUDA_AWARE='0', CUPY_FAKE_MPI_CUDA_AWARE='0')
    res = run_pytest_under_mpi(LATER, n, timeout=300, env=env)
    assert ' skipped' not in res.stdout, res.stdout[-3000:]  # the stand-in really ran them


def test_base_class_declares_zero_fill_like_every_implementation():
    base = inspect.signature(CommunicatorBase.allreduce_grad)
    assert list(base.parameters) == ['self', 'model', 'zero_fill']
    assert base.parameters['zero_fill'].default is True
    impls = [NaiveCommunicator]
    from chainermn_comm.gpu import _base, flat, hierarchical, pure_nccl, single_node, two_dimensional
    impls += [_base.GpuCommunicatorBase, flat.FlatCommunicator, pure_nccl.PureNcclCommunicator,
              single_node.SingleNodeCommunicator, hierarchical.HierarchicalCommunicator,
              hierarchical.NonCudaAwareCommunicator, two_dimensional.TwoDimensionalCommunicator]
    for cls in impls:
        sig = inspect.signature(cls.allreduce_grad)
        assert sig.parameters['zero_fill'].default == base.parameters['zero_fill'].default, cls
    assert inspect.signature(CommunicatorBase.multi_node_mean_grad).parameters['zero_fill'].default is True


def _minimal_communicator():
    """Return a user's communicator written against the base class; it records allreduce_grad calls."""
    stubs = {}
    for name in CommunicatorBase.__abstractmethods__:
        if isinstance(inspect.getattr_static(CommunicatorBase, name), property):
            stubs[name] = property(lambda self: 0)
        else:
            stubs[name] = lambda self, *args, **kwargs: None
    calls = []
    stubs['allreduce_grad'] = lambda self, model, zero_fill=True: calls.append((model, zero_fill))
    return type('Minimal', (CommunicatorBase,), stubs)(), calls


def test_base_multi_node_mean_grad_passes_zero_fill_and_finalize_is_a_no_op():
    c, calls = _minimal_communicator()
    c.multi_node_mean_grad('m', zero_fill=False)
    c.multi_node_mean_grad('m')
    c.allreduce_grad('m', False)
    assert calls == [('m', False), ('m', True), ('m', False)]
    assert c.finalize() is None and c.finalize() is None
