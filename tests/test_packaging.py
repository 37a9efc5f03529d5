"""Every package builds with Poetry into a wheel whose metadata names no filesystem path."""

import os
import re
import shutil
import subprocess
import sys
import zipfile

import pytest

from packaging_support import PACKAGES, ROOT

SIBLINGS = set(PACKAGES)


def _poetry():
    here = os.path.join(os.path.dirname(sys.executable), 'poetry')
    return here if os.access(here, os.X_OK) else shutil.which('poetry')


def _metadata(wheel):
    with zipfile.ZipFile(wheel) as zf:
        name = next(n for n in zf.namelist() if n.endswith('.dist-info/METADATA'))
        return zf.read(name).decode()


@pytest.mark.parametrize('package', PACKAGES)
def test_poetry_build_has_no_paths_in_metadata(package, tmp_path):
    poetry = _poetry()
    if poetry is None:
        pytest.skip('poetry is not installed (scripts/bootstrap.sh installs it)')
    res = subprocess.run([poetry, 'build', '--format', 'wheel', '--output', str(tmp_path)],
                         cwd=os.path.join(ROOT, 'packages', package), capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    wheels = list(tmp_path.glob('*.whl'))
    assert len(wheels) == 1, wheels
    meta = _metadata(str(wheels[0]))
    requires = [line for line in meta.splitlines() if line.startswith('Requires-Dist:')]
    for line in requires:
        assert 'file:' not in line and ' @ ' not in line and '../' not in line, line
    assert ROOT not in meta and '/packages/' not in meta
    named = {}
    for line in requires:
        spec = line.split(':', 1)[1].strip()
        named[re.split(r'[\s;(<>=!\[]', spec)[0]] = spec
    if package != 'chainermn-comm':
        assert 'chainermn-comm' in named, (package, named)
    for sibling in SIBLINGS & set(named):
        assert re.search(r'[<>=]', named[sibling]), 'sibling dependency needs a version range: ' + named[sibling]


def _project(package):
    import tomllib
    with open(os.path.join(ROOT, 'packages', package, 'pyproject.toml'), 'rb') as f:
        return tomllib.load(f)['project']


def _requirements(project):
    from packaging.requirements import Requirement
    reqs = [Requirement(r) for r in project.get('dependencies', [])]
    for extra, items in project.get('optional-dependencies', {}).items():
        reqs += [(extra, Requirement(r)) for r in items]
    return reqs


def test_metadata_states_the_supported_stack():
    """One version line for all six, after the original 1.3.1; NumPy 1.26 to 2.x; Python 3.9 to 3.14."""
    from packaging.version import Version
    versions = {p: _project(p)['version'] for p in PACKAGES}
    assert len(set(versions.values())) == 1, versions
    version = Version(versions['chainermn'])
    assert version > Version('1.3.1') and version.major == 2, version
    for package in PACKAGES:
        project = _project(package)
        assert project['requires-python'] == '>=3.9,<3.15', package
        # The classifiers name the Pythons CI proves (.ci/run: 3.11 and 3.14).
        for minor in ('3', '3.11', '3.14'):
            assert 'Programming Language :: Python :: ' + minor in project['classifiers'], package
        for req in _requirements(project):
            if isinstance(req, tuple):
                req = req[1]
            if req.name == 'numpy':
                assert str(req.specifier) == '<3,>=1.26', (package, str(req))
            if req.name in SIBLINGS:  # every sibling range holds the sibling's version, no more
                assert version in req.specifier, (package, str(req))
                assert Version('{}.{}.0'.format(version.major, version.minor + 1)) not in req.specifier
    # The import names report the same version.
    import chainermn
    import chainermn_comm
    import chainermn_links
    import chainermn_tools
    import chainermn_train
    for mod in (chainermn, chainermn_comm, chainermn_links, chainermn_tools, chainermn_train):
        assert mod.__version__ == str(version), mod


def test_gpu_extras_allow_cupy_13_and_14():
    extras = {}
    for item in _requirements(_project('chainermn-comm')):
        if isinstance(item, tuple):
            extras.setdefault(item[0], []).append(item[1])
    (gpu,) = extras['gpu']
    assert gpu.name == 'cupy-cuda12x', gpu
    assert all(v in gpu.specifier for v in ('13.0.0', '13.6.0', '14.0.0', '14.2.0')), gpu
    assert '12.3.0' not in gpu.specifier and '15.0.0' not in gpu.specifier, gpu
    (cuda13,) = extras['gpu-cuda13']
    assert cuda13.name == 'cupy-cuda13x', cuda13
    assert '14.2.0' in cuda13.specifier and '13.6.0' not in cuda13.specifier, cuda13
    meta = {item[0]: str(item[1]) for item in _requirements(_project('chainermn'))
            if isinstance(item, tuple)}
    assert meta['gpu'].startswith('chainermn-comm[gpu]'), meta
    assert meta['gpu-cuda13'].startswith('chainermn-comm[gpu-cuda13]'), meta
