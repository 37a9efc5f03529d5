"""The meta-package is a facade: the tools' old names and ``python -m chainermn COMMAND`` keep working."""

import subprocess
import sys

import pytest


def _run(code):
    return subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=120)


def test_import_chainermn_loads_no_tool():
    """``import chainermn`` imports nothing of chainermn-tools until a tool is used."""
    res = _run('import sys, chainermn\n'
               'print(sorted(m for m in sys.modules if m.startswith("chainermn_tools")))')
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == '[]'


@pytest.mark.parametrize('old, new, name', [
    ('chainermn.cluster', 'chainermn_tools.cluster', 'Cluster'),
    ('chainermn.cluster', 'chainermn_tools.cluster', 'missing'),
    ('chainermn.cluster._net', 'chainermn_tools.cluster._net', 'BURST_SECONDS'),
    ('chainermn.slurm', 'chainermn_tools.slurm', 'local_cluster'),
    ('chainermn.slurm', 'chainermn_tools.slurm', 'allocation'),
    ('chainermn.doctor', 'chainermn_tools.doctor', 'main'),
    ('chainermn.doctor._slurm', 'chainermn_tools.doctor._slurm', 'slurm_rows'),
    ('chainermn.launch', 'chainermn_tools.launch', 'run_on_cluster'),
    ('chainermn.launch._hosts', 'chainermn_tools.launch._hosts', 'read_hosts'),
])
def test_old_module_paths_are_the_tools_modules(old, new, name):
    """``chainermn.TOOL[.sub]`` is the very module object of ``chainermn_tools.TOOL[.sub]``."""
    import importlib
    old_mod, new_mod = importlib.import_module(old), importlib.import_module(new)
    assert old_mod is new_mod
    assert getattr(old_mod, name) is getattr(new_mod, name)
    assert new_mod.__spec__.name == new


def test_attribute_access_reaches_the_tools():
    """``chainermn.slurm.local_cluster`` works without importing ``chainermn.slurm`` first."""
    res = _run('import chainermn, chainermn_tools.slurm as s\n'
               'assert chainermn.slurm.local_cluster is s.local_cluster\n'
               'assert chainermn.cluster.Cluster.__module__.startswith("chainermn_tools.")\n'
               'print("ok")')
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == 'ok'


def test_unknown_tool_submodule_is_not_found():
    with pytest.raises(ModuleNotFoundError):
        import chainermn.cluster._no_such_module  # noqa: F401


@pytest.mark.parametrize('command', ['doctor', 'cluster', 'launch', 'trace'])
def test_python_m_chainermn_dispatches(command):
    """``python -m chainermn COMMAND --help`` reaches the tool's own argument parser."""
    res = subprocess.run([sys.executable, '-m', 'chainermn', command, '--help'], capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert 'usage: python -m chainermn {}'.format(command) in res.stdout


def test_python_m_chainermn_usage_and_unknown_command():
    res = subprocess.run([sys.executable, '-m', 'chainermn'], capture_output=True, text=True, timeout=60)
    assert res.returncode == 2
    assert all(c in res.stdout for c in ('doctor', 'cluster', 'launch', 'trace')), res.stdout
    res = subprocess.run([sys.executable, '-m', 'chainermn', 'bogus'], capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 2
    assert "unknown command 'bogus'" in res.stderr
