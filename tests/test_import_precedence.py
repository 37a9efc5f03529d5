"""``import chainermn`` is our meta-package, not the older copy Chainer 7.8.1 installs.

Dev install (editable) is checked in the running venv; a fresh non-editable install is checked
in new venvs in both install orders (Chainer first / ours first).
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SUB_PACKAGES = ['chainermn-comm', 'chainermn-data', 'chainermn-links', 'chainermn-train']
PACKAGES = SUB_PACKAGES + ['chainermn']

PROBE = textwrap.dedent('''
    import json, os, sys, sysconfig
    import chainermn, chainermn_comm
    import chainermn.links
    from chainermn.functions import send
    site = sysconfig.get_paths()['purelib']
    bundled = os.path.join(site, 'chainermn', '__init__.py')
    print('PROBE ' + json.dumps({
        'file': os.path.realpath(chainermn.__file__),
        'site': os.path.realpath(site),
        'same_factory': chainermn.create_communicator is chainermn_comm.create_communicator,
        'version': getattr(chainermn, '__version__', None),
        'links': chainermn.links.__name__,
        'bundled_exists': os.path.exists(bundled),
        'finder_first': type(sys.meta_path[0]).__name__,
    }))
''')


def _probe(python, cwd):
    res = subprocess.run([python, '-c', PROBE], cwd=str(cwd), capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    assert 'Error processing line' not in res.stderr, res.stderr  # a broken .pth is reported so
    line = next(ln for ln in res.stdout.splitlines() if ln.startswith('PROBE '))
    return json.loads(line[len('PROBE '):])


def test_dev_install_imports_ours(tmp_path):
    got = _probe(sys.executable, tmp_path)
    ours = os.path.realpath(os.path.join(ROOT, 'packages', 'chainermn', 'src', 'chainermn'))
    assert got['file'] == os.path.join(ours, '__init__.py'), got
    assert got['same_factory'] is True
    assert got['links'] == 'chainermn.links'
    assert got['version'] == '0.1.0'


def test_dev_install_beats_a_chainermn_dir_on_sys_path(tmp_path):
    """Even a ``chainermn`` directory in the current directory does not shadow ours."""
    fake = tmp_path / 'chainermn'
    fake.mkdir()
    (fake / '__init__.py').write_text('raise ImportError("the wrong chainermn was imported")\n')
    got = _probe(sys.executable, tmp_path)
    assert got['file'].startswith(os.path.realpath(os.path.join(ROOT, 'packages', 'chainermn')))


def test_hook_finder_only_claims_chainermn():
    sys.path.insert(0, os.path.join(ROOT, 'packages', 'chainermn', 'src'))
    try:
        import _chainermn_precedence as hook
    finally:
        sys.path.pop(0)
    finder = hook.ChainermnFinder(os.path.join(ROOT, 'packages', 'chainermn', 'src'))
    assert finder.find_spec('chainermn_comm') is None
    assert finder.find_spec('chainermn.links') is None
    spec = finder.find_spec('chainermn')
    assert spec.origin == os.path.join(ROOT, 'packages', 'chainermn', 'src', 'chainermn',
                                       '__init__.py')
    assert hook.install() is hook.install()  # idempotent: one finder only


# ---------------------------------------------------------------------------------------------
# Fresh non-editable installs (slow: two venvs; pip's cache makes them a minute or two).

def _run(cmd, **kw):
    res = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=900, **kw)
    assert res.returncode == 0, '{}\n{}\n{}'.format(' '.join(map(str, cmd)), res.stdout[-5000:],
                                                     res.stderr[-5000:])
    return res


@pytest.fixture(scope='module')
def wheels(tmp_path_factory):
    """Build our five wheels once (poetry-core from this venv, no isolation needed)."""
    out = tmp_path_factory.mktemp('wheels')
    _run([sys.executable, '-m', 'pip', 'wheel', '-q', '--no-deps', '--no-build-isolation',
          '-w', out] + [os.path.join(ROOT, 'packages', p) for p in PACKAGES])
    found = sorted(str(p) for p in out.glob('*.whl'))
    assert len(found) == len(PACKAGES), found
    return found


def _new_venv(path):
    _run([sys.executable, '-m', 'venv', path])
    python = os.path.join(str(path), 'bin', 'python')
    pip = [python, '-m', 'pip', 'install', '-q', '--disable-pip-version-check']
    _run(pip + ['setuptools<74', 'numpy>=1.26,<2', 'wheel'])
    return python, pip


def _install_chainer(pip):
    _run(pip + ['--no-build-isolation', 'chainer==7.8.1'])


def _check_fresh(python, cwd):
    got = _probe(python, cwd)
    assert got['file'] == os.path.join(got['site'], '_chainermn_meta', 'chainermn', '__init__.py'), got
    assert got['same_factory'] is True, got
    assert got['finder_first'] in ('ChainermnFinder', 'DistutilsMetaFinder'), got
    # Chainer's own files are left alone: its bundled package is still on disk, just not imported.
    assert got['bundled_exists'] is True, got
    return got


@pytest.mark.slow
def test_fresh_install_chainer_first(tmp_path, wheels):
    python, pip = _new_venv(tmp_path / 'venv')
    _install_chainer(pip)
    _run(pip + ['mpi4py', 'mpich'])
    _run(pip + wheels)  # with dependencies: the siblings come from the wheels on the command line
    _check_fresh(python, tmp_path)
    # Uninstalling ours gives Chainer's copy back, intact.
    _run([python, '-m', 'pip', 'uninstall', '-y', '-q', 'chainermn'])
    res = _run([python, '-c', 'import chainermn, os, sysconfig; print(os.path.dirname('
                'os.path.realpath(chainermn.__file__)) == os.path.join(os.path.realpath('
                'sysconfig.get_paths()["purelib"]), "chainermn"))'], cwd=str(tmp_path))
    assert res.stdout.strip().splitlines()[-1] == 'True', res.stdout + res.stderr


@pytest.mark.slow
def test_fresh_install_ours_first(tmp_path, wheels):
    python, pip = _new_venv(tmp_path / 'venv')
    _run(pip + ['--no-deps'] + wheels)
    _run(pip + ['mpi4py', 'mpich'])
    _install_chainer(pip)
    _check_fresh(python, tmp_path)
    _run([python, '-m', 'pip', 'check'])
