"""The meta-package's build backend names local siblings by direct reference only in the checkout.

Fast (no pip): the backend's hooks are called in-process; one test runs ``python -m build``.
"""

import base64
import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import urllib.parse
import zipfile

import pytest
from packaging.requirements import Requirement

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
META = os.path.join(ROOT, 'packages', 'chainermn')
SIBLINGS = ['chainermn-comm', 'chainermn-data', 'chainermn-links', 'chainermn-train']
ENV = 'CHAINERMN_NO_LOCAL_SIBLINGS'
#: Every package of the repository has this version (tests/test_packaging.py checks it).
VERSION = '2.0.0'

# Requires-Dist of the meta-package as (name, extras, specifier, url, marker).
RANGES = {
    ('chainermn-comm', (), '<2.1,>=2.0', None, None),
    ('chainermn-comm', ('gpu',), '<2.1,>=2.0', None, 'extra == "gpu"'),
    ('chainermn-comm', ('gpu-cuda13',), '<2.1,>=2.0', None, 'extra == "gpu-cuda13"'),
    ('chainermn-data', (), '<2.1,>=2.0', None, None),
    ('chainermn-links', (), '<2.1,>=2.0', None, None),
    ('chainermn-train', (), '<2.1,>=2.0', None, None),
}


def _url(package):
    return 'file://' + os.path.join(ROOT, 'packages', package)


DIRECT = {
    ('chainermn-comm', (), '', _url('chainermn-comm'), None),
    ('chainermn-comm', ('gpu',), '', _url('chainermn-comm'), 'extra == "gpu"'),
    ('chainermn-comm', ('gpu-cuda13',), '', _url('chainermn-comm'), 'extra == "gpu-cuda13"'),
    ('chainermn-data', (), '', _url('chainermn-data'), None),
    ('chainermn-links', (), '', _url('chainermn-links'), None),
    ('chainermn-train', (), '', _url('chainermn-train'), None),
}


def _load_backend(source_dir):
    path = os.path.join(source_dir, '_build', 'chainermn_build_backend.py')
    name = 'chainermn_build_backend_{}'.format(abs(hash(source_dir)))
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def backend(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.chdir(META)  # PEP 517 hooks run in the source directory
    return _load_backend(META)


def _headers(metadata_text):
    return metadata_text.split('\n\n', 1)[0]  # the README (description) follows the blank line


def _requires(metadata_text):
    out = set()
    for line in _headers(metadata_text).splitlines():
        if line.startswith('Requires-Dist:'):
            req = Requirement(line.split(':', 1)[1].strip())  # must be valid PEP 508
            out.add((req.name, tuple(sorted(req.extras)), str(req.specifier), req.url,
                     str(req.marker) if req.marker else None))
    return out


def _read_wheel(wheel):
    """Return (METADATA text, names in the wheel), checking every RECORD hash and size."""
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        record = next(n for n in names if n.endswith('.dist-info/RECORD'))
        rows = [ln.rsplit(',', 2) for ln in zf.read(record).decode().splitlines() if ln]
        assert sorted(r[0] for r in rows) == sorted(names), (rows, names)
        for path, digest, size in rows:
            if path == record:
                assert (digest, size) == ('', ''), (path, digest, size)
                continue
            data = zf.read(path)
            want = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()
            assert (digest, int(size)) == ('sha256=' + want, len(data)), path
        meta = next(n for n in names if n.endswith('.dist-info/METADATA'))
        return zf.read(meta).decode(), names


def _prepare(backend, tmp_path, hook='prepare_metadata_for_build_wheel'):
    out = tmp_path / 'meta'
    out.mkdir()
    name = getattr(backend, hook)(str(out))
    assert name == 'chainermn-{}.dist-info'.format(VERSION)
    return str(out / name), (out / name / 'METADATA').read_text()


# ---------------------------------------------------------------------------------------------
# The rewrite logic on its own.

@pytest.mark.parametrize('version,specifier,expected', [
    ('0.1.0', '>=0.1,<0.2', True),
    ('0.1.9', '>=0.1,<0.2', True),
    ('0.2.0', '>=0.1,<0.2', False),
    ('0.0.9', '>=0.1,<0.2', False),
    ('0.1.0', '', True),
    ('0.1.0', '==0.1', True),
    ('0.1.1', '==0.1', False),
    ('0.1.0', '!=0.1.0', False),
    ('0.1.0', '>0.1', False),
    ('0.1.1', '>0.1', True),
    ('0.1', '<=0.1.0', True),
    ('0.1.5', '~=0.1', True),
    ('1.0.0', '~=0.1', False),
    ('0.1.3', '~=0.1.0', True),
    ('0.2.0', '~=0.1.0', False),
    ('0.1.0', '~=1', False),           # invalid: ~= needs two release parts
    ('0.1.0rc1', '>=0.1,<0.2', False),  # not understood: keep the range
    ('0.1.0', '==0.1.*', False),
    ('0.1.0', '===0.1.0', False),
])
def test_version_satisfies(backend, version, specifier, expected):
    assert backend.version_satisfies(version, specifier) is expected


def _sibling(packages, dirname, name, version):
    d = packages / dirname
    d.mkdir()
    (d / 'pyproject.toml').write_text(
        '[build-system]\nname = "not-this"\n\n[project]\nname = "{}"\nversion = "{}"\n'
        'dependencies = ["x"]\n'.format(name, version))


def test_rewrite_requirement_needs_a_matching_sibling(backend, tmp_path):
    packages = tmp_path / 'a b%'  # a URL-quoted path
    packages.mkdir()
    source = str(packages / 'chainermn')
    _sibling(packages, 'chainermn-comm', 'chainermn_comm', '0.1.0')
    _sibling(packages, 'chainermn-data', 'chainermn-data', '0.2.0')       # outside the range
    _sibling(packages, 'chainermn-links', 'something-else', '0.1.0')     # another project
    url = 'file://' + urllib.parse.quote(str(packages)) + '/chainermn-comm'
    assert url.endswith('/a%20b%25/chainermn-comm'), url
    cases = [
        ('chainermn-comm (>=0.1,<0.2)', 'chainermn-comm @ ' + url),
        ('chainermn-comm[gpu] (>=0.1,<0.2) ; extra == "gpu"',
         'chainermn-comm[gpu] @ ' + url + ' ; extra == "gpu"'),
        ('Chainermn.Comm>=0.1,<0.2; python_version >= "3.9"',
         'Chainermn.Comm @ ' + url + ' ; python_version >= "3.9"'),
        ('chainermn-comm', 'chainermn-comm @ ' + url),
        ('chainermn-comm (>=0.2)', 'chainermn-comm (>=0.2)'),
        ('chainermn-data (>=0.1,<0.2)', 'chainermn-data (>=0.1,<0.2)'),
        ('chainermn-links (>=0.1,<0.2)', 'chainermn-links (>=0.1,<0.2)'),
        ('chainermn-train (>=0.1,<0.2)', 'chainermn-train (>=0.1,<0.2)'),   # no such directory
        ('numpy (>=1.26,<2)', 'numpy (>=1.26,<2)'),
        ('chainermn-comm @ https://example.invalid/c.whl', 'chainermn-comm @ https://example.invalid/c.whl'),
    ]
    got = [backend.rewrite_requirement(before, source) for before, _ in cases]
    assert got == [after for _, after in cases]
    for line in got:
        Requirement(line)  # every output is valid PEP 508


def test_rewrite_metadata_touches_only_requires_dist_headers(backend, tmp_path):
    _sibling(tmp_path, 'chainermn-comm', 'chainermn-comm', '0.1.3')
    text = ('Metadata-Version: 2.4\nName: chainermn\nRequires-Python: >=3.9\n'
            'Requires-Dist: chainermn-comm (>=0.1,<0.2)\n\n'
            'Requires-Dist: chainermn-comm (>=0.1,<0.2)\n')  # in the description: left alone
    got = backend.rewrite_metadata(text, str(tmp_path / 'chainermn'))
    assert got == ('Metadata-Version: 2.4\nName: chainermn\nRequires-Python: >=3.9\n'
                   'Requires-Dist: chainermn-comm @ file://{}/chainermn-comm\n\n'
                   'Requires-Dist: chainermn-comm (>=0.1,<0.2)\n').format(tmp_path)


def test_project_table_without_tomllib_matches_tomllib(backend, monkeypatch):
    paths = [os.path.join(ROOT, 'packages', p, 'pyproject.toml') for p in SIBLINGS + ['chainermn']]
    with_tomllib = [backend._project_table(p) for p in paths]
    monkeypatch.setitem(sys.modules, 'tomllib', None)  # what Python < 3.11 sees
    without = [backend._project_table(p) for p in paths]
    assert with_tomllib == without == [(p, VERSION) for p in SIBLINGS + ['chainermn']]


@pytest.mark.parametrize('value,enabled', [(None, True), ('', True), ('0', True), ('1', False),
                                           ('yes', False), ('true', False)])
def test_env_var_switch(backend, value, enabled):
    environ = {} if value is None else {ENV: value}
    assert backend.local_siblings_enabled(environ) is enabled


# ---------------------------------------------------------------------------------------------
# The PEP 517 hooks, as pip and publishing tools call them.

def test_checkout_metadata_has_direct_references_and_wheel_keeps_them(backend, tmp_path):
    dist_info, text = _prepare(backend, tmp_path)
    assert _requires(text) == DIRECT
    wheels = tmp_path / 'wheels'
    wheels.mkdir()
    name = backend.build_wheel(str(wheels), None, dist_info)  # pip passes the prepared metadata
    wheel_text, names = _read_wheel(str(wheels / name))
    assert wheel_text == text
    assert 'chainermn_precedence.pth' in names
    assert '_chainermn_meta/chainermn/__init__.py' in names


def test_env_var_keeps_poetry_metadata(backend, tmp_path, monkeypatch):
    monkeypatch.setenv(ENV, '1')
    _, text = _prepare(backend, tmp_path)
    plain = tmp_path / 'plain'
    plain.mkdir()
    name = backend._poetry.prepare_metadata_for_build_wheel(str(plain))
    assert text == (plain / name / 'METADATA').read_text()  # byte for byte poetry-core's
    assert _requires(text) == RANGES
    assert 'file:' not in _headers(text) and ROOT not in text


def test_outside_checkout_keeps_ranges(tmp_path, monkeypatch):
    """A source tree without siblings next to it (an unpacked sdist) keeps the version ranges."""
    monkeypatch.delenv(ENV, raising=False)
    copy = tmp_path / 'unpacked' / ('chainermn-' + VERSION)
    shutil.copytree(META, str(copy), ignore=shutil.ignore_patterns('__pycache__', 'tests'))
    monkeypatch.chdir(str(copy))
    backend = _load_backend(str(copy))
    _, text = _prepare(backend, tmp_path)
    plain = tmp_path / 'plain'
    plain.mkdir()
    name = backend._poetry.prepare_metadata_for_build_wheel(str(plain))
    assert text == (plain / name / 'METADATA').read_text()  # byte for byte poetry-core's
    assert _requires(text) == RANGES
    wheels = tmp_path / 'wheels'
    wheels.mkdir()
    wheel_text, _ = _read_wheel(str(wheels / backend.build_wheel(str(wheels))))
    assert _requires(wheel_text) == RANGES


def test_wheel_built_without_prepared_metadata_keeps_ranges(backend, tmp_path):
    name = backend.build_wheel(str(tmp_path))
    text, names = _read_wheel(str(tmp_path / name))
    assert _requires(text) == RANGES
    assert 'file:' not in _headers(text) and ROOT not in text
    assert 'chainermn_precedence.pth' in names


def test_editable_keeps_ranges_and_gets_the_hook(backend, tmp_path):
    dist_info, text = _prepare(backend, tmp_path, 'prepare_metadata_for_build_editable')
    assert _requires(text) == RANGES
    wheels = tmp_path / 'wheels'
    wheels.mkdir()
    name = backend.build_editable(str(wheels), None, dist_info)
    wheel_text, names = _read_wheel(str(wheels / name))
    assert _requires(wheel_text) == RANGES
    assert 'chainermn_precedence.pth' in names
    assert 'chainermn.pth' in names  # poetry-core's path .pth: src/ on sys.path


def test_sdist_keeps_ranges(backend, tmp_path):
    import tarfile
    name = backend.build_sdist(str(tmp_path))
    with tarfile.open(str(tmp_path / name)) as tf:
        pkg_info = tf.extractfile('chainermn-{}/PKG-INFO'.format(VERSION)).read().decode()
        assert 'chainermn-{}/_build/chainermn_build_backend.py'.format(VERSION) in tf.getnames()
    assert _requires(pkg_info) == RANGES


def test_pypa_build_wheel_keeps_ranges(tmp_path):
    """``python -m build`` (and ``poetry build`` when it builds in isolation) calls build_wheel
    without prepared metadata: the wheel has the version ranges, no path."""
    env = {k: v for k, v in os.environ.items() if k != ENV}
    res = subprocess.run([sys.executable, '-m', 'build', '--wheel', '--no-isolation', '--outdir',
                          str(tmp_path), META], capture_output=True, text=True, timeout=300,
                         env=env, cwd=str(tmp_path))
    assert res.returncode == 0, res.stdout + res.stderr
    wheels = list(tmp_path.glob('*.whl'))
    assert len(wheels) == 1, wheels
    text, _ = _read_wheel(str(wheels[0]))
    assert _requires(text) == RANGES
    assert ROOT not in text
