"""chainermn-train keeps the house rules: comm through its public names or engine, one parser, small modules."""

import ast
import glob
import os
import re
import sys

import pytest

from chainermn_comm import protocol

SRC = os.path.join(os.path.dirname(__file__), '..', 'src', 'chainermn_train')
PYPROJECT = os.path.join(os.path.dirname(__file__), '..', 'pyproject.toml')
MODULES = sorted(glob.glob(os.path.join(SRC, '**', '*.py'), recursive=True))
#: Import name -> distribution name, for what chainermn-train may import.
DISTRIBUTIONS = {'chainermn_comm': 'chainermn-comm', 'chainer': 'chainer', 'numpy': 'numpy',
                 'mpi4py': 'mpi4py', 'cupy': None,   # cupy: optional, through chainermn-comm[gpu]
                 'zlib_ng': 'zlib-ng'}


def _imports(path):
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            yield node.module, node.lineno
            for alias in node.names:
                yield '{}.{}'.format(node.module, alias.name), node.lineno


def test_comm_is_reached_only_through_public_names_or_engine():
    bad = ['{}:{}: {}'.format(os.path.relpath(p, SRC), line, name) for p in MODULES
           for name, line in _imports(p)
           if name.startswith('chainermn_comm.') and any(part.startswith('_')
                                                         for part in name.split('.')[1:])]
    assert bad == []


def test_declared_dependencies_are_the_imported_distributions():
    third_party = {name.split('.')[0] for p in MODULES for name, _ in _imports(p)} - {'chainermn_train'}
    third_party -= set(sys.stdlib_module_names)
    assert third_party <= set(DISTRIBUTIONS), third_party
    imported = {DISTRIBUTIONS[m] for m in third_party if DISTRIBUTIONS[m] is not None}
    with open(PYPROJECT) as f:
        text = f.read()
    block = re.search(r'^dependencies = \[(.*?)\]', text, re.S | re.M).group(1)
    declared = {re.match(r'[A-Za-z0-9_.-]+', d).group(0) for d in re.findall(r'"([^"]+)"', block)}
    assert declared == imported


def test_every_chainermn_variable_is_read_through_settings():
    for path in MODULES:
        with open(path) as f:
            text = f.read()
        assert not re.search(r'environ(\.get)?\s*[\[(]', text), path
        assert not re.search(r"""['"]CHAINERMN_[A-Z_]+['"]""", text), path


def test_no_module_over_450_lines():
    sizes = {os.path.relpath(p, SRC): sum(1 for _ in open(p)) for p in MODULES}
    assert {p: n for p, n in sizes.items() if n > 450} == {}


def test_nothing_writes_to_stderr_or_prints():
    for path in MODULES:
        with open(path) as f:
            text = f.read()
        assert 'sys.stderr' not in text and not re.search(r'^\s*print\(', text, re.M), path


@pytest.mark.parametrize('name,value', [(protocol.OVERLAP_MODE_ENV, 'sideways'),
                                        (protocol.OVERLAP_BUCKET_BYTES_ENV, '0'),
                                        (protocol.OVERLAP_BUCKET_BYTES_ENV, 'big')])
def test_bad_overlap_settings_raise_the_settings_error(monkeypatch, name, value):
    from chainermn_train import _overlap
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=r"^{}='{}' is not understood".format(name, value)):
        if name == protocol.OVERLAP_MODE_ENV:
            _overlap._mode_setting()
        else:
            _overlap.BackwardOverlap(None, None)


@pytest.mark.parametrize('value,mode', [('stream', 'stream'), ('END', 'end'), ('', '')])
def test_overlap_mode_setting(monkeypatch, value, mode):
    from chainermn_train import _overlap
    monkeypatch.setenv(protocol.OVERLAP_MODE_ENV, value)
    assert _overlap._mode_setting() == mode


def test_checkpoint_flags_through_settings(monkeypatch):
    from chainermn_train.checkpoint.ownership import trust
    monkeypatch.setenv(protocol.START_FRESH_ENV, 'yes')
    assert trust.start_fresh(None) is True and trust.start_fresh(False) is False
    monkeypatch.setenv(protocol.START_FRESH_ENV, 'later')
    with pytest.raises(ValueError, match=r"CHAINERMN_START_FRESH='later' is not understood"):
        trust.start_fresh(None)
    monkeypatch.setenv(protocol.ALLOW_PICKLE_ENV, 'on')
    assert trust.allow_pickle(None) == (True, 'CHAINERMN_ALLOW_PICKLE=1')


def test_preempted_exit_status_is_the_protocols():
    from chainermn_train import preemption
    assert preemption.PREEMPTED_EXIT_STATUS == protocol.PREEMPTED_EXIT_STATUS == 75
