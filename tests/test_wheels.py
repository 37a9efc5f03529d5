"""Portable wheels and sdists: version ranges only, no path, installable with the source tree gone.

All six packages build with the standard poetry-core backend (``pip wheel`` for wheels, poetry-core's
PEP 517 API for sdists) from a copy of ``packages/``; the copy is deleted before the wheels are
installed into a fresh venv, so nothing can resolve to a checkout.
"""

import email.parser
import json
import os
import re
import shutil
import sys
import tarfile
import textwrap
import zipfile

import pytest

from packaging_support import PACKAGES, ROOT, build_sdists, build_wheels, new_bare_venv, repo_version, run

VERSION = repo_version('chainermn')
_DIST = {p: p.replace('-', '_') for p in PACKAGES}


@pytest.fixture(scope='module')
def built(tmp_path_factory):
    """Build the six wheels and sdists from a copy of ``packages/``, then delete the copy."""
    base = tmp_path_factory.mktemp('build')
    src = base / 'src'
    shutil.copytree(os.path.join(ROOT, 'packages'), str(src / 'packages'),
                    ignore=shutil.ignore_patterns('__pycache__', '*.egg-info', 'dist', 'build'))
    wheels = build_wheels(str(base / 'wheels'), root=str(src))
    sdists = build_sdists(str(base / 'sdists'), root=str(src))
    shutil.rmtree(str(src))
    return {'wheels': wheels, 'sdists': sdists, 'gone': str(src)}


def _wheel_metadata(wheel):
    with zipfile.ZipFile(wheel) as zf:
        name = next(n for n in zf.namelist() if n.endswith('.dist-info/METADATA'))
        return zf.read(name).decode()


def _sdist_files(sdist):
    with tarfile.open(sdist) as tf:
        return {m.name.split('/', 1)[1]: tf.extractfile(m).read()
                for m in tf.getmembers() if m.isfile()}


def _requires(metadata_text):
    return email.parser.Parser().parsestr(metadata_text).get_all('Requires-Dist') or []


def _assert_ranges_only(where, requires, text, gone):
    for req in requires:
        assert 'file:' not in req and ' @ ' not in req and '/' not in req, (where, req)
    for bad in (ROOT, gone):  # no absolute path of a checkout anywhere, README included
        assert bad not in text, (where, bad)
    siblings = [r for r in requires if re.match(r'chainermn(-[a-z]+)?\b', r)]
    for req in siblings:
        assert '>=2.0' in req and '<2.1' in req, (where, 'sibling needs a version range', req)


def test_every_wheel_requires_version_ranges_only(built):
    names = sorted(os.path.basename(w).split('-')[0] for w in built['wheels'])
    assert names == sorted(_DIST.values()), names
    for wheel in built['wheels']:
        text = _wheel_metadata(wheel)
        _assert_ranges_only(os.path.basename(wheel), _requires(text), text, built['gone'])


def test_every_sdist_holds_no_path(built):
    for sdist in built['sdists']:
        files = _sdist_files(sdist)
        text = files['PKG-INFO'].decode()
        _assert_ranges_only(os.path.basename(sdist), _requires(text), text, built['gone'])
        for name, data in files.items():
            assert ROOT.encode() not in data and built['gone'].encode() not in data, (sdist, name)
        import tomllib
        project = tomllib.loads(files['pyproject.toml'].decode())
        assert project['build-system']['build-backend'] == 'poetry.core.masonry.api', sdist
        poetry = project.get('tool', {}).get('poetry', {})
        tables = [poetry.get('dependencies', {})] + [
            g.get('dependencies', {}) for g in poetry.get('group', {}).values()]
        for table in tables:
            for dep, spec in table.items():
                assert not (isinstance(spec, dict) and ('path' in spec or 'url' in spec)), (sdist, dep)


def test_every_source_module_is_in_its_wheel(built):
    # v7's module paths in the meta-package (docs/compat.md) and the modules behind them.
    for package in PACKAGES:
        src = os.path.join(ROOT, 'packages', package, 'src')
        want = {os.path.relpath(os.path.join(d, f), src).replace(os.sep, '/')
                for d, _, files in os.walk(src) for f in files if f.endswith('.py')}
        if package == 'chainermn':   # our chainermn lives under _chainermn_meta/ (README: precedence)
            want = {n if not n.startswith('chainermn/') else '_chainermn_meta/' + n for n in want}
        wheel = next(w for w in built['wheels'] if os.path.basename(w).startswith(_DIST[package] + '-'))
        with zipfile.ZipFile(wheel) as zf:
            missing = want - set(zf.namelist())
        assert not missing, (package, sorted(missing))
    assert '_chainermn_meta/chainermn/communicators/communicator_base.py' in want


def test_meta_wheel_requires_the_libraries_and_the_tools(built):
    meta = next(w for w in built['wheels'] if os.path.basename(w).startswith('chainermn-'))
    requires = sorted(_requires(_wheel_metadata(meta)))
    assert requires == sorted([
        'chainermn-comm[bfloat16] (>=2.0,<2.1)', 'chainermn-data (>=2.0,<2.1)', 'chainermn-links (>=2.0,<2.1)',
        'chainermn-train (>=2.0,<2.1)', 'chainermn-tools (>=2.0,<2.1)', 'numpy (>=1.26,<3)',
        'chainermn-comm[gpu] (>=2.0,<2.1) ; extra == "gpu"',
        'chainermn-comm[gpu-cuda13] (>=2.0,<2.1) ; extra == "gpu-cuda13"',
        'chainermn-comm[powersgd] (>=2.0,<2.1) ; extra == "powersgd"',
        'chainermn-tools[plot] (>=2.0,<2.1) ; extra == "plot"']), requires
    with zipfile.ZipFile(meta) as zf:
        names = set(zf.namelist())
    # The import-precedence hook sits at the wheel root, so pip puts it into site-packages.
    assert 'chainermn_precedence.pth' in names, sorted(names)
    assert '_chainermn_meta/chainermn/__init__.py' in names
    assert not any('/doctor/' in n or '/cluster/' in n or '/slurm/' in n for n in names), sorted(names)
    tools = next(w for w in built['wheels'] if os.path.basename(w).startswith('chainermn_tools-'))
    requires = _requires(_wheel_metadata(tools))
    assert not any(re.match(r'chainermn\b(?!-)', r) for r in requires), requires  # no circle


PROBE = textwrap.dedent('''
    import json, os, sysconfig, subprocess, sys
    import chainermn, chainermn_comm
    comm = chainermn.create_communicator('naive')
    doctor = subprocess.run([sys.executable, '-m', 'chainermn', 'doctor', '--no-cuda-aware-check'],
                            capture_output=True, text=True, timeout=300)
    print('PROBE ' + json.dumps({
        'file': os.path.realpath(chainermn.__file__),
        'site': os.path.realpath(sysconfig.get_paths()['purelib']),
        'same_factory': chainermn.create_communicator is chainermn_comm.create_communicator,
        'size': comm.size, 'cluster': chainermn.cluster.Cluster.__module__,
        'doctor': doctor.returncode, 'doctor_tail': doctor.stdout[-2000:] + doctor.stderr[-2000:],
    }))
''')


@pytest.mark.slow
def test_pip_install_the_six_wheels_with_the_source_tree_gone(built, tmp_path):
    """Chainer first (with the setuptools<81 build-constraint file), then the six wheels by path."""
    dist = tmp_path / 'dist'
    dist.mkdir()
    for wheel in built['wheels']:
        shutil.copy(wheel, str(dist))
    python, pip = new_bare_venv(tmp_path / 'venv')
    constraint = tmp_path / 'c.txt'
    constraint.write_text('setuptools<81\n')
    install = pip + ['install', '-q', '--disable-pip-version-check']
    run(install + ['--build-constraint', constraint, 'chainer==7.8.1'], cwd=str(tmp_path))
    wheels = sorted(str(dist / n) for n in os.listdir(str(dist)))
    run(install + ['--find-links', dist, 'mpich'] + wheels, cwd=str(tmp_path))
    run(pip + ['check'])
    res = run([python, '-c', PROBE], cwd=str(tmp_path), timeout=600)
    got = json.loads(next(ln for ln in res.stdout.splitlines() if ln.startswith('PROBE '))[6:])
    assert got['file'] == os.path.join(got['site'], '_chainermn_meta', 'chainermn', '__init__.py'), got
    assert got['same_factory'] is True and got['size'] == 1, got
    assert got['cluster'] == 'chainermn_tools.cluster._cluster', got
    assert got['doctor'] == 0, got['doctor_tail']
    assert '0 failed' in got['doctor_tail'], got['doctor_tail']
