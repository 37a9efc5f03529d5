"""ChainerMN: distributed training for Chainer.

This meta-package exposes the documented ``chainermn`` API, re-exported from the sub-packages
``chainermn_comm`` (communicators), ``chainermn_data`` (datasets, iterators), ``chainermn_links``
(model-parallel links and functions) and ``chainermn_train`` (optimizer, evaluator, extensions).
The communicator core is imported eagerly (it is light and installs the global except hook when
``CHAINERMN_FORCE_ABORT_ON_EXCEPTION`` is set); everything that needs Chainer is imported on
first use, so ``import chainermn`` and ``python -m chainermn doctor`` stay fast.
"""

import importlib

from chainermn import _tools, communicators, global_except_hook
from chainermn._version import __version__
from chainermn_comm import (CommunicationError, CommunicatorBase, CommunicatorUnavailableError,
                            CPUModeWarning, create_communicator)

#: Documented top-level names that live in sub-packages which import Chainer (loaded on first use).
_LAZY_NAMES = {
    'scatter_dataset': 'chainermn_data',
    'MultiNodeChainList': 'chainermn_links',
    'create_multi_node_optimizer': 'chainermn_train',
    'create_multi_node_evaluator': 'chainermn_train',
    'create_multi_node_checkpointer': 'chainermn_train',
    'create_multi_node_checkpoint': 'chainermn_train',
    'scatter_index': 'chainermn_data.scatter_index',
    'DataSizeError': 'chainermn_data.scatter_index',
}
#: Documented submodules, imported on first attribute access (``import chainermn.links`` also works).
#: v7's module paths below these are thin re-exports too (docs/compat.md).
_SUBMODULES = ('datasets', 'extensions', 'functions', 'hooks', 'iterators', 'links', 'nccl',
               'optimizers', 'testing')

# ``chainermn.cluster``, ``.doctor``, ``.launch``, ``.slurm``: chainermn-tools, on first import.
_tools.install()

__all__ = sorted(['__version__', 'create_communicator', 'CommunicatorBase', 'CommunicationError',
                  'CommunicatorUnavailableError', 'CPUModeWarning', 'communicators',
                  'global_except_hook'] + list(_LAZY_NAMES) + list(_SUBMODULES))


def __getattr__(name):
    """Import a documented name or submodule the first time it is used."""
    if name in _SUBMODULES or name in _tools.TOOLS:
        return importlib.import_module('chainermn.' + name)
    if name in _LAZY_NAMES:
        value = getattr(importlib.import_module(_LAZY_NAMES[name]), name)
        globals()[name] = value
        return value
    raise AttributeError("module 'chainermn' has no attribute {!r}".format(name))


def __dir__():
    """List the public API together with what is already loaded."""
    return sorted(set(globals()) | set(__all__))
