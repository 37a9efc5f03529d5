"""``import chainermn`` is our meta-package, not the older copy Chainer 7.8.1 installs.

Dev install (editable, ``scripts/bootstrap.sh``: the hook ``.pth`` copied into site-packages) is
checked in the running venv; a fresh non-editable install is checked in new venvs in both install
orders: Chainer first, then the documented six-path ``pip install packages/chainermn-comm ...
packages/chainermn`` from the checkout; ours first, from the six wheels built with ``pip wheel``
(poetry-core: version ranges, no paths).
"""

import json
import os
import subprocess
import sys
import textwrap
import zipfile

import pytest

from packaging_support import PACKAGES, ROOT, build_wheels
from packaging_support import repo_version as _repo_version
from packaging_support import run as _run

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
    assert got['version'] == _repo_version('chainermn')


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

@pytest.fixture(scope='module')
def wheels(tmp_path_factory):
    """Build our six wheels once with ``pip wheel`` (poetry-core: sibling version ranges, no paths)."""
    found = build_wheels(str(tmp_path_factory.mktemp('wheels')))
    version = _repo_version('chainermn')
    meta = next(w for w in found if os.path.basename(w).startswith('chainermn-' + version))
    with zipfile.ZipFile(meta) as zf:
        text = zf.read('chainermn-{}.dist-info/METADATA'.format(version)).decode()
    requires = [ln for ln in text.splitlines() if ln.startswith('Requires-Dist:')]
    assert sorted(requires) == ['Requires-Dist: chainermn-comm[bfloat16] (>=2.0,<2.1)',
                        'Requires-Dist: chainermn-comm[gpu-cuda13] (>=2.0,<2.1) ; extra == "gpu-cuda13"',
                        'Requires-Dist: chainermn-comm[gpu] (>=2.0,<2.1) ; extra == "gpu"',
                        'Requires-Dist: chainermn-comm[powersgd] (>=2.0,<2.1) ; extra == "powersgd"',
                        'Requires-Dist: chainermn-data (>=2.0,<2.1)',
                        'Requires-Dist: chainermn-links (>=2.0,<2.1)',
                        'Requires-Dist: chainermn-tools (>=2.0,<2.1)',
                        'Requires-Dist: chainermn-tools[plot] (>=2.0,<2.1) ; extra == "plot"',
                        'Requires-Dist: chainermn-train (>=2.0,<2.1)',
                        'Requires-Dist: numpy (>=1.26,<3)'], requires  # any order
    return found


# NumPy 1.26 has wheels up to Python 3.12 only: newer Pythons get today's stack (the newest NumPy 2
# and setuptools; Chainer built under a setuptools<81 build constraint), never NumPy from source.
OLD_STACK = sys.version_info < (3, 13)


def _new_venv(path):
    _run([sys.executable, '-m', 'venv', path])
    python = os.path.join(str(path), 'bin', 'python')
    pip = [python, '-m', 'pip', 'install', '-q', '--disable-pip-version-check']
    if OLD_STACK:
        _run(pip + ['setuptools<74', 'numpy>=1.26,<2', 'wheel'])
    else:
        _run(pip + ['--upgrade', 'pip'])  # --build-constraint needs pip 25.3
        _run(pip + ['--only-binary', 'numpy', 'numpy>=2,<3', 'setuptools', 'wheel'])
    return python, pip


def _install_chainer(pip):
    if OLD_STACK:
        _run(pip + ['--no-build-isolation', 'chainer==7.8.1'])
        return
    venv = os.path.dirname(os.path.dirname(pip[0]))
    constraint = os.path.join(venv, 'build-constraint.txt')
    with open(constraint, 'w') as f:
        f.write('setuptools<81\n')
    _run(pip + ['--build-constraint', constraint, 'chainer==7.8.1'])


def _check_fresh(python, cwd):
    got = _probe(python, cwd)
    assert got['file'] == os.path.join(got['site'], '_chainermn_meta', 'chainermn', '__init__.py'), got
    assert got['same_factory'] is True, got
    assert got['finder_first'] in ('CompatFinder', 'ChainermnFinder', 'DistutilsMetaFinder'), got
    # Chainer's own files are left alone: its bundled package is still on disk, just not imported.
    assert got['bundled_exists'] is True, got
    return got


SMOKE = textwrap.dedent('''
    import importlib.metadata as md, json
    import chainermn
    comm = chainermn.create_communicator('naive')
    data = chainermn.scatter_dataset(list(range(7)), comm)
    dists = {}
    for name in %r:
        dist = md.distribution(name)
        url = dist.read_text('direct_url.json')
        dists[name] = [dist.version, json.loads(url) if url else None]
    print('SMOKE ' + json.dumps({'size': comm.size, 'rank': comm.rank,
                                 'data': [int(x) for x in data], 'dists': dists}))
''') % (PACKAGES,)


#: The documented standard command that installs all six from a checkout (packages/chainermn/README.md).
CHECKOUT_PATHS = ['packages/' + p for p in PACKAGES]


@pytest.mark.slow
def test_fresh_install_chainer_first_six_paths(tmp_path):
    """Chainer first, then ``pip install packages/chainermn-comm ... packages/chainermn`` from the repo root."""
    python, pip = _new_venv(tmp_path / 'venv')
    _install_chainer(pip)
    _run(pip + ['mpi4py', 'mpich'])
    _run(pip + CHECKOUT_PATHS, cwd=ROOT)
    res = _run([python, '-c', SMOKE], cwd=str(tmp_path))
    got = json.loads(next(ln for ln in res.stdout.splitlines() if ln.startswith('SMOKE '))[6:])
    assert (got['size'], got['rank'], got['data']) == (1, 0, list(range(7))), got
    for name in PACKAGES:  # installed, at the repo's versions, from the checkout, not editable
        version, direct = got['dists'][name]
        assert version == _repo_version(name), (name, got)
        assert direct == {'url': 'file://' + os.path.join(ROOT, 'packages', name),
                          'dir_info': {}}, (name, direct)
    _check_fresh(python, tmp_path)
    _run([python, '-m', 'pip', 'check'])
    # The [gpu] extra of the meta-package reaches chainermn-comm[gpu] (cupy-cuda12x).
    report = tmp_path / 'report.json'
    _run(pip + ['--dry-run', '--report', report, 'packages/chainermn[gpu]'] + CHECKOUT_PATHS[:-1],
         cwd=ROOT)
    with open(str(report)) as f:
        planned = {i['metadata']['name']: i['download_info']['url']
                   for i in json.load(f)['install']}
    assert 'cupy-cuda12x' in planned, planned
    # Uninstalling ours gives Chainer's copy back, intact.
    _run([python, '-m', 'pip', 'uninstall', '-y', '-q', 'chainermn'])
    # Chainer's bundled copy is what ``import chainermn`` finds again.  On NumPy 2 Chainer 7.8.1
    # imports only through our compat hook, just uninstalled: there the spec is checked unexecuted.
    where = ('chainermn.__file__' if OLD_STACK else 'importlib.util.find_spec("chainermn").origin')
    res = _run([python, '-c', 'import importlib.util, os, sysconfig{}; print(os.path.dirname('
                'os.path.realpath({})) == os.path.join(os.path.realpath('
                'sysconfig.get_paths()["purelib"]), "chainermn"))'.format(
                    ', chainermn' if OLD_STACK else '', where)], cwd=str(tmp_path))
    assert res.stdout.strip().splitlines()[-1] == 'True', res.stdout + res.stderr


@pytest.mark.slow
def test_fresh_install_ours_first(tmp_path, wheels):
    python, pip = _new_venv(tmp_path / 'venv')
    _run(pip + ['--no-deps'] + wheels)
    _run(pip + ['mpi4py', 'mpich', 'threadpoolctl', 'zlib-ng'])
    _install_chainer(pip)
    _check_fresh(python, tmp_path)
    _run([python, '-m', 'pip', 'check'])
