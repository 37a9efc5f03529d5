"""Every package builds with Poetry into a wheel whose metadata names no filesystem path."""

import os
import re
import shutil
import subprocess
import sys
import zipfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ['chainermn-comm', 'chainermn-data', 'chainermn-links', 'chainermn-train', 'chainermn']
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
