"""Every ``chainermn.*`` name the seeds document resolves on our meta-package."""

import glob
import importlib
import os
import re

import pytest

SEEDS = os.environ.get('CHAINERMN_TEST_SEEDS', os.path.join(os.path.dirname(__file__), '..', '..',
                                                       'shared', 'seeds'))
SEED_FILES = sorted(glob.glob(os.path.join(SEEDS, '*.txt')))
IDENT = r'[A-Za-z_][A-Za-z0-9_]*'
#: Dotted names that appear in the seeds' prose but are not API (none known so far).
PROSE_ONLY = set()
#: Names the reference and tutorial certainly document; the parser must find all of them.
MUST_FIND = {
    'chainermn.create_communicator', 'chainermn.CommunicatorBase', 'chainermn.scatter_dataset',
    'chainermn.create_multi_node_optimizer', 'chainermn.create_multi_node_evaluator',
    'chainermn.create_multi_node_checkpointer', 'chainermn.create_multi_node_checkpoint',
    'chainermn.MultiNodeChainList', 'chainermn.datasets.create_empty_dataset',
    'chainermn.links.MultiNodeBatchNormalization', 'chainermn.functions.send',
    'chainermn.functions.recv', 'chainermn.functions.pseudo_connect', 'chainermn.functions.bcast',
    'chainermn.functions.gather', 'chainermn.functions.scatter', 'chainermn.functions.alltoall',
    'chainermn.functions.allgather', 'chainermn.iterators.create_multi_node_iterator',
    'chainermn.iterators.create_synchronized_iterator', 'chainermn.extensions.AllreducePersistent',
    'chainermn.global_except_hook.add_hook', 'chainermn.CommunicatorBase.allreduce_grad',
    'chainermn.CommunicatorBase.inter_size', 'chainermn.MultiNodeChainList.add_link',
}


def documented_names(text):
    """Return the dotted ``chainermn.*`` names in ``text`` (reference, tutorial, index entries)."""
    names = set(re.findall(r'\bchainermn(?:\.{0})+'.format(IDENT), text))
    # The HTML reference breaks 'chainermn.\nname\n(' over lines.
    names |= {'chainermn.' + n for n in re.findall(r'\bchainermn\.\n({0})\s*\n'.format(IDENT), text)}
    # Index entries: 'send() (chainermn.CommunicatorBase method)', 'rank (... attribute)',
    # 'bcast() (in module chainermn.functions)', 'AllreducePersistent (class in chainermn.extensions)'.
    # A parameter type such as 'comm (chainermn.communicators._base.CommunicatorBase)' is not one.
    for name, owner in re.findall(r'\b({0})(?:\(\))? \((?:in module |class in )(chainermn(?:\.{0})*)\)'
                                  .format(IDENT), text):
        names.add(owner + '.' + name)
    for name, owner in re.findall(r'\b({0})(?:\(\))? \((chainermn(?:\.{0})*) (?:method|attribute)\)'
                                  .format(IDENT), text):
        names.add(owner + '.' + name)
    return {n.rstrip('.') for n in names if n.rstrip('.') != 'chainermn'} - PROSE_ONLY


SNAPSHOT = os.path.join(os.path.dirname(__file__), 'seed_api_names.txt')


def _snapshot_names():
    with open(SNAPSHOT) as f:
        return {line.strip() for line in f if line.strip() and not line.startswith('#')}


def _all_names():
    names = set()
    for path in SEED_FILES:
        with open(path, encoding='utf-8', errors='replace') as f:
            names |= documented_names(f.read())
    return sorted(names)


def resolve(dotted):
    """Import/getattr ``dotted`` step by step; raise AttributeError naming the missing part."""
    parts = dotted.split('.')
    obj = importlib.import_module(parts[0])
    for i, part in enumerate(parts[1:], 1):
        if hasattr(obj, part):
            obj = getattr(obj, part)
            continue
        try:
            obj = importlib.import_module('.'.join(parts[:i + 1]))
        except ImportError as e:
            raise AttributeError('{} is missing ({} has no {!r}: {})'.format(
                dotted, '.'.join(parts[:i]), part, e))
    return obj


@pytest.mark.skipif(not SEED_FILES, reason='seed documents not found at ' + SEEDS)
def test_parser_finds_the_documented_api():
    names = set(_all_names())
    assert MUST_FIND <= names, sorted(MUST_FIND - names)


def test_parser_ignores_prose():
    text = ('See chainermn. The end. Import chainermn.\nThen call chainermn.functions.send() now.\n'
            'comm (chainermn.communicators._base.CommunicatorBase) - ChainerMN communicator.\n'
            'rank (chainermn.CommunicatorBase attribute), 12')
    assert documented_names(text) == {'chainermn.functions.send', 'chainermn.CommunicatorBase.rank',
                                      'chainermn.CommunicatorBase',
                                      'chainermn.communicators._base.CommunicatorBase'}


@pytest.mark.skipif(not SEED_FILES, reason='seed documents not found at ' + SEEDS)
def test_snapshot_matches_the_seeds():
    assert _snapshot_names() == set(_all_names()), 'regenerate tests/seed_api_names.txt'


def test_every_documented_name_resolves():
    missing = []
    # The snapshot keeps this test complete when the seeds are not beside the checkout.
    for name in sorted(set(_all_names()) | _snapshot_names() | MUST_FIND):
        try:
            resolve(name)
        except Exception as e:  # ImportError from a sub-package counts as missing too
            missing.append('{}: {}: {}'.format(name, type(e).__name__, e))
    assert not missing, 'documented names missing from chainermn:\n' + '\n'.join(missing)


def test_documented_module_paths_are_real_submodules():
    import chainermn
    for sub in ('functions', 'links', 'iterators', 'datasets', 'extensions', 'communicators',
                'global_except_hook'):
        mod = importlib.import_module('chainermn.' + sub)
        assert mod is getattr(chainermn, sub)
        assert mod.__name__ == 'chainermn.' + sub
    from chainermn.functions import send  # noqa: F401
    from chainermn.communicators import CommunicatorBase, create_communicator
    assert create_communicator is chainermn.create_communicator
    assert CommunicatorBase is chainermn.CommunicatorBase


def test_reexports_are_the_sub_package_objects():
    import chainermn
    import chainermn_comm
    import chainermn_data
    import chainermn_links
    import chainermn_train
    assert chainermn.create_communicator is chainermn_comm.create_communicator
    assert chainermn.CommunicatorBase is chainermn_comm.CommunicatorBase
    assert chainermn.scatter_dataset is chainermn_data.scatter_dataset
    assert chainermn.MultiNodeChainList is chainermn_links.MultiNodeChainList
    assert chainermn.create_multi_node_optimizer is chainermn_train.create_multi_node_optimizer
    assert chainermn.create_multi_node_evaluator is chainermn_train.create_multi_node_evaluator
    assert chainermn.create_multi_node_checkpointer is chainermn_train.create_multi_node_checkpointer
    assert chainermn.create_multi_node_checkpoint is chainermn_train.create_multi_node_checkpoint
    assert chainermn.global_except_hook.add_hook is chainermn_comm.global_except_hook.add_hook
    assert isinstance(chainermn.__version__, str) and chainermn.__version__.count('.') == 2
    for name in chainermn.__all__:
        assert getattr(chainermn, name) is not None, name


def test_later_version_links_names():
    # Added by Chainer v7's chainermn (issue 18); not in the seeds.
    import chainermn
    import chainermn_links
    assert 'create_multi_node_n_step_rnn' in chainermn.links.__all__
    assert chainermn.links.create_multi_node_n_step_rnn is chainermn_links.links.create_multi_node_n_step_rnn
    assert resolve('chainermn.links.create_multi_node_n_step_rnn') is chainermn.links.create_multi_node_n_step_rnn


def test_unknown_attribute_raises_attribute_error():
    import chainermn
    with pytest.raises(AttributeError, match='no_such_name'):
        chainermn.no_such_name  # noqa: B018


#: Public names of the later ChainerMN (the one bundled with Chainer v5-v7) provided here too, with
#: the signatures that version documented (issue 18).
LATER_SIGNATURES = {
    'chainermn.CommunicatorBase.finalize': '(self)',
    'chainermn.CommunicatorBase.allreduce_grad': '(self, model, zero_fill=True)',
    'chainermn.extensions.multi_node_snapshot': '(comm, snapshot, replica_sets)',
    'chainermn.extensions.MultiNodeEarlyStoppingTrigger':
        "(comm, check_trigger=(1, 'epoch'), monitor='main/loss', patience=3, mode='auto', "
        "verbose=False, max_trigger=(100, 'epoch'))",
    'chainermn.extensions.ObservationAggregator':
        "(comm, original_key, aggregated_key=None, *, comm_trigger=(1, 'iteration'), aggregator=None)",
    'chainermn.extensions.GenericMultiNodeEvaluator':
        '(comm, iterator, target, device=None, converter=CONCAT, root=0, progress_hook=None)',
}


@pytest.mark.parametrize('name', sorted(LATER_SIGNATURES))
def test_later_version_names_resolve_with_their_signatures(name):
    import inspect

    import chainer
    obj = resolve(name)
    sig = str(inspect.signature(obj)).replace(repr(chainer.dataset.concat_examples), 'CONCAT')
    assert sig == LATER_SIGNATURES[name]


def test_later_version_names_are_exported_where_that_version_had_them():
    import chainermn
    import chainermn_train
    for name in ('multi_node_snapshot', 'MultiNodeEarlyStoppingTrigger', 'ObservationAggregator',
                 'GenericMultiNodeEvaluator'):
        assert name in chainermn.extensions.__all__
        assert getattr(chainermn.extensions, name) is getattr(chainermn_train.extensions, name)
    import chainermn_comm
    for method in ('finalize', 'allreduce_grad', 'multi_node_mean_grad'):
        assert callable(getattr(chainermn_comm.NaiveCommunicator, method))  # no MPI here
