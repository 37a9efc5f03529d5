"""Every public module path of Chainer v7.8.1's chainermn imports, each in a fresh interpreter,
with the public names v7's module defines, and each name is the very object the package exports.

The list below was written down from Chainer 7.8.1's bundled ``chainermn`` (its modules without a
``_`` segment, and the classes, functions and module-level names each defines or re-exports); no
download at test time. ``chainermn.nccl`` defines its names only where CuPy has NCCL (as v7's).
"""

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

V7_MODULES = {
    'chainermn': [
        'communicators', 'datasets', 'extensions', 'functions', 'global_except_hook', 'iterators',
        'links', 'optimizers', 'CommunicatorBase', 'create_communicator', 'DataSizeError',
        'scatter_index', 'scatter_dataset', 'create_multi_node_checkpointer',
        'create_multi_node_evaluator', 'MultiNodeChainList', 'create_multi_node_optimizer'],
    'chainermn.global_except_hook': ['add_hook'],
    'chainermn.nccl': [],
    'chainermn.optimizers': ['create_multi_node_optimizer'],
    'chainermn.communicators': ['create_communicator', 'CommunicatorBase'],
    'chainermn.communicators.communicator_base': ['CommunicatorBase'],
    'chainermn.communicators.dummy_communicator': ['DummyCommunicator'],
    'chainermn.communicators.flat_communicator': ['FlatCommunicator'],
    'chainermn.communicators.mpi_communicator_base': ['MpiCommunicatorBase'],
    'chainermn.communicators.naive_communicator': ['NaiveCommunicator'],
    'chainermn.communicators.non_cuda_aware_communicator': ['NonCudaAwareCommunicator'],
    'chainermn.communicators.pure_nccl_communicator': ['PureNcclCommunicator'],
    'chainermn.datasets': ['create_empty_dataset', 'DataSizeError', 'scatter_index', 'scatter_dataset'],
    'chainermn.datasets.empty_dataset': ['create_empty_dataset'],
    'chainermn.datasets.scatter': ['DataSizeError', 'scatter_dataset', 'scatter_index',
                                   'get_n_iterations_for_one_epoch', 'get_epoch_trigger'],
    'chainermn.extensions': ['AllreducePersistent', 'create_multi_node_checkpointer',
                             'create_multi_node_evaluator', 'GenericMultiNodeEvaluator',
                             'multi_node_snapshot', 'ObservationAggregator',
                             'MultiNodeEarlyStoppingTrigger'],
    'chainermn.extensions.allreduce_persistent': ['AllreducePersistent'],
    'chainermn.extensions.checkpoint': ['create_multi_node_checkpointer'],
    'chainermn.extensions.multi_node_early_stopping_trigger': ['MultiNodeEarlyStoppingTrigger'],
    'chainermn.extensions.multi_node_evaluator': ['GenericMultiNodeEvaluator',
                                                  'create_multi_node_evaluator'],
    'chainermn.extensions.observation_aggregator': ['ObservationAggregator'],
    'chainermn.functions': ['allgather', 'alltoall', 'bcast', 'gather', 'scatter', 'recv', 'send',
                            'pseudo_connect'],
    'chainermn.functions.batch_normalization': ['get_communication_backend', 'MultiNodeBNImplSelector'],
    'chainermn.functions.collective_communication': ['AllGather', 'AllToAll', 'Bcast', 'Gather',
                                                     'Scatter', 'allgather', 'alltoall', 'bcast',
                                                     'gather', 'scatter'],
    'chainermn.functions.point_to_point_communication': ['Send', 'Recv', 'send', 'recv'],
    'chainermn.functions.pseudo_connect': ['PseudoConnect', 'pseudo_connect'],
    'chainermn.iterators': ['create_multi_node_iterator', 'create_synchronized_iterator'],
    'chainermn.iterators.multi_node_iterator': ['create_multi_node_iterator'],
    'chainermn.iterators.synchronized_iterator': ['create_synchronized_iterator'],
    'chainermn.links': ['MultiNodeBatchNormalization', 'create_mnbn_model', 'MultiNodeChainList',
                        'create_multi_node_n_step_rnn'],
    'chainermn.links.batch_normalization': ['MultiNodeBatchNormalization'],
    'chainermn.links.create_mnbn_model': ['create_mnbn_model'],
    'chainermn.links.multi_node_chain_list': ['MultiNodeChainList'],
    'chainermn.links.n_step_rnn': ['create_multi_node_n_step_rnn'],
    'chainermn.testing': ['get_device'],
    'chainermn.testing.device': ['get_device'],
}

#: Where each name lives in the sub-packages: the re-export must be that very object.
ORIGINS = {
    'CommunicatorBase': 'chainermn_comm:CommunicatorBase',
    'MpiCommunicatorBase': 'chainermn_comm:MpiCommunicatorBase',
    'NaiveCommunicator': 'chainermn_comm:NaiveCommunicator',
    'FlatCommunicator': 'chainermn_comm.gpu.flat:FlatCommunicator',
    'NonCudaAwareCommunicator': 'chainermn_comm.gpu.hierarchical:NonCudaAwareCommunicator',
    'PureNcclCommunicator': 'chainermn_comm.gpu.pure_nccl:PureNcclCommunicator',
    'DummyCommunicator': 'chainermn_comm.dummy:DummyCommunicator',
    'create_communicator': 'chainermn_comm:create_communicator',
    'add_hook': 'chainermn_comm.global_except_hook:add_hook',
    'scatter_dataset': 'chainermn_data:scatter_dataset',
    'create_empty_dataset': 'chainermn_data:create_empty_dataset',
    'scatter_index': 'chainermn_data.scatter_index:scatter_index',
    'DataSizeError': 'chainermn_data.scatter_index:DataSizeError',
    'create_multi_node_iterator': 'chainermn_data:create_multi_node_iterator',
    'create_synchronized_iterator': 'chainermn_data:create_synchronized_iterator',
    'MultiNodeChainList': 'chainermn_links:MultiNodeChainList',
    'MultiNodeBatchNormalization': 'chainermn_links.links:MultiNodeBatchNormalization',
    'create_mnbn_model': 'chainermn_links.links:create_mnbn_model',
    'create_multi_node_n_step_rnn': 'chainermn_links.links:create_multi_node_n_step_rnn',
    'send': 'chainermn_links.functions:send',
    'recv': 'chainermn_links.functions:recv',
    'pseudo_connect': 'chainermn_links.functions:pseudo_connect',
    'bcast': 'chainermn_links.functions:bcast',
    'gather': 'chainermn_links.functions:gather',
    'scatter': 'chainermn_links.functions:scatter',
    'alltoall': 'chainermn_links.functions:alltoall',
    'allgather': 'chainermn_links.functions:allgather',
    'create_multi_node_optimizer': 'chainermn_train:create_multi_node_optimizer',
    'create_multi_node_evaluator': 'chainermn_train:create_multi_node_evaluator',
    'create_multi_node_checkpointer': 'chainermn_train:create_multi_node_checkpointer',
    'AllreducePersistent': 'chainermn_train.extensions:AllreducePersistent',
    'GenericMultiNodeEvaluator': 'chainermn_train.extensions:GenericMultiNodeEvaluator',
    'ObservationAggregator': 'chainermn_train.extensions:ObservationAggregator',
    'MultiNodeEarlyStoppingTrigger': 'chainermn_train.extensions:MultiNodeEarlyStoppingTrigger',
    'multi_node_snapshot': 'chainermn_train.extensions:multi_node_snapshot',
    'get_device': 'chainermn_links.testing:get_device',
}

#: Run in a fresh interpreter for one module path: import it, report what is missing or not the same.
_PROBE = r'''
import importlib, json, os, sys
path, names, origins = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
mod = importlib.import_module(path)
import chainermn
ours = os.path.dirname(chainermn.__file__)
problems = []
if sys.modules[path] is not mod or mod.__name__ != path:
    problems.append('not the module {}'.format(path))
if not os.path.abspath(mod.__file__).startswith(ours + os.sep) or \
        not os.path.exists(os.path.join(ours, '_meta_marker.py')):
    problems.append('{} is not ours: {}'.format(path, mod.__file__))
for name in names:
    if not hasattr(mod, name):
        problems.append('missing {}.{}'.format(path, name))
        continue
    if name in origins:
        where, attr = origins[name].split(':')
        if getattr(mod, name) is not getattr(importlib.import_module(where), attr):
            problems.append('{}.{} is not {}'.format(path, name, origins[name]))
for name in getattr(mod, '__all__', []):
    if not hasattr(mod, name):
        problems.append('{}.__all__ names {} but it is missing'.format(path, name))
if path == 'chainermn.nccl':
    expected = {'hidden': False, 'stand-in': True}.get(sys.argv[4])
    if expected is not None and mod._available != expected:
        problems.append('chainermn.nccl._available is {} with CuPy {}'.format(mod._available, sys.argv[4]))
    if mod._available:
        from cupy.cuda import nccl
        problems += ['chainermn.nccl.{} is not cupy.cuda.nccl\'s'.format(n)
                     for n in ('NcclCommunicator', 'get_unique_id', 'NCCL_SUM', 'NcclError')
                     if getattr(mod, n, None) is not getattr(nccl, n)]
print(json.dumps(problems))
'''


def _probe(path, cupy_from=None):
    """Probe ``path`` in a fresh interpreter; ``cupy_from``: a folder whose ``cupy`` comes first."""
    env = dict(os.environ)
    if cupy_from:
        env['PYTHONPATH'] = os.pathsep.join([cupy_from] + [p for p in env.get('PYTHONPATH', '').split(os.pathsep) if p])
    cupy = {None: 'as installed', _NO_CUPY: 'hidden', _FAKECUPY: 'stand-in'}[cupy_from]
    res = subprocess.run([sys.executable, '-c', _PROBE, path, json.dumps(V7_MODULES[path]),
                          json.dumps(ORIGINS), cupy], capture_output=True, text=True, timeout=240, env=env)
    if res.returncode != 0:
        return ['{}: status {}: {}'.format(path, res.returncode, res.stderr.strip()[-2000:])]
    return json.loads(res.stdout.strip().splitlines()[-1])


_NO_CUPY = os.path.join(os.path.dirname(__file__), 'no_cupy')
_FAKECUPY = os.path.join(os.path.dirname(__file__), '..', '..', 'chainermn-comm', 'tests', 'fakecupy')


def test_the_list_has_v7_s_28_module_paths_below_the_packages():
    leaves = [p for p in V7_MODULES if not any(q.startswith(p + '.') for q in V7_MODULES)]
    assert len(leaves) == 28 and len(V7_MODULES) == 36


def test_every_v7_module_path_imports_with_its_names_in_a_fresh_interpreter():
    with ThreadPoolExecutor(max_workers=3) as pool:
        runs = [pool.submit(_probe, path) for path in sorted(V7_MODULES)]
        # v7's chainermn.nccl imports without CuPy; with one (the NumPy stand-in of chainermn-comm's
        # tests, where it is there) its names are cupy.cuda.nccl's.
        runs.append(pool.submit(_probe, 'chainermn.nccl', cupy_from=_NO_CUPY))
        if os.path.isdir(_FAKECUPY):
            runs.append(pool.submit(_probe, 'chainermn.nccl', cupy_from=_FAKECUPY))
        problems = [p for run in runs for p in run.result()]
    assert problems == []


def test_optuna_style_import_and_isinstance():
    # What optuna-integration's ChainerMNStudy and its tests do.
    from chainermn.communicators.communicator_base import CommunicatorBase

    import chainermn
    assert CommunicatorBase is chainermn.CommunicatorBase
    comm = chainermn.create_communicator('naive')
    assert isinstance(comm, CommunicatorBase)


@pytest.mark.parametrize('path', ['chainermn.functions.pseudo_connect', 'chainermn.links.create_mnbn_model'])
def test_package_attribute_is_the_function_as_in_v7(path):
    # v7's package __init__ binds the function over its module's name; a later import keeps it so.
    import importlib
    package, name = path.rsplit('.', 1)
    module = importlib.import_module(path)
    assert callable(getattr(importlib.import_module(package), name))
    assert getattr(module, name) is getattr(importlib.import_module(package), name)
