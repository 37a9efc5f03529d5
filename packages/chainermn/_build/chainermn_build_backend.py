"""PEP 517/660 backend for the chainermn meta-package: poetry-core plus two additions.

1. The import-precedence ``.pth``.  poetry-core puts ``chainermn_precedence.pth`` into regular
   wheels through ``[tool.poetry] include``, but its editable wheels hold only a path ``.pth`` and
   no included files.  This wrapper adds the hook ``.pth`` to every wheel that lacks it (rewriting
   RECORD), so ``pip install -e`` gets the same ``import chainermn`` precedence as ``pip install``.

2. Local siblings.  In a monorepo checkout (``../chainermn-comm/pyproject.toml`` etc. next to this
   package, at a version inside the declared range) the metadata that
   ``prepare_metadata_for_build_wheel`` hands to an installer names each sibling by a PEP 508
   direct reference (``chainermn-comm @ file:///.../packages/chainermn-comm``), so
   ``pip install packages/chainermn`` installs the sub-packages too.  ``build_wheel`` puts that
   metadata into the wheel only when the frontend passes it back (``metadata_directory``, as pip
   does); a wheel built without it (``python -m build``, ``poetry build``), an sdist, an editable
   wheel, a build outside the checkout, or any build with ``CHAINERMN_NO_LOCAL_SIBLINGS=1`` keeps
   the plain version ranges and no path.  Standard library only (besides poetry-core itself).
"""

import base64
import hashlib
import os
import re
import shutil
import sys
import tempfile
import urllib.parse
import urllib.request
import zipfile

from poetry.core.masonry import api as _poetry

__all__ = ['build_editable', 'build_sdist', 'build_wheel', 'get_requires_for_build_editable',
           'get_requires_for_build_sdist', 'get_requires_for_build_wheel',
           'prepare_metadata_for_build_editable', 'prepare_metadata_for_build_wheel']

PTH_NAME = 'chainermn_precedence.pth'
NO_LOCAL_SIBLINGS_ENV = 'CHAINERMN_NO_LOCAL_SIBLINGS'
SOURCE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_PTH_SOURCE = os.path.join(SOURCE_DIR, PTH_NAME)

get_requires_for_build_wheel = _poetry.get_requires_for_build_wheel
get_requires_for_build_sdist = _poetry.get_requires_for_build_sdist
get_requires_for_build_editable = _poetry.get_requires_for_build_editable
prepare_metadata_for_build_editable = _poetry.prepare_metadata_for_build_editable
build_sdist = _poetry.build_sdist


# ---------------------------------------------------------------------------------------------
# Local siblings: version ranges -> direct references, only inside the monorepo checkout.

_REQUIREMENT = re.compile(
    r'^(?P<name>[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)\s*'
    r'(?P<extras>\[[^\]]*\])?\s*'
    r'(?:\((?P<paren>[^)]*)\)|(?P<bare>[^;]*?))\s*'
    r'(?:;\s*(?P<marker>.*?))?\s*$')
_CLAUSE = re.compile(r'^(~=|==|!=|<=|>=|<|>)\s*(\S+)$')
_RELEASE = re.compile(r'^\d+(?:\.\d+)*$')


def local_siblings_enabled(environ=None):
    """Tell whether the rewrite is on: unless CHAINERMN_NO_LOCAL_SIBLINGS is set (to not 0)."""
    value = (os.environ if environ is None else environ).get(NO_LOCAL_SIBLINGS_ENV, '')
    return value.strip().lower() in ('', '0', 'false', 'no', 'off')


def _normalize(name):
    return re.sub(r'[-_.]+', '-', name).lower()


def _release(text):
    return tuple(int(part) for part in text.split('.')) if _RELEASE.match(text) else None


def version_satisfies(version, specifier):
    """Tell whether ``version`` is inside ``specifier`` (e.g. ``>=0.1,<0.2``).

    Only plain release versions (``1.2.3``) and the operators ``~= == != <= >= < >`` are
    understood; anything else (pre-releases, wildcards, ``===``) answers False, which keeps the
    version range in the metadata: never a wrong direct reference.
    """
    have = _release(version.strip())
    if have is None:
        return False
    for clause in (c.strip() for c in specifier.split(',')):
        if not clause:
            continue
        match = _CLAUSE.match(clause)
        want = _release(match.group(2)) if match else None
        if want is None:
            return False
        op = match.group(1)
        width = max(len(have), len(want))
        a = have + (0,) * (width - len(have))
        b = want + (0,) * (width - len(want))
        if op == '~=':
            ok = len(want) >= 2 and a >= b and a[:len(want) - 1] == want[:-1]
        else:
            ok = {'==': a == b, '!=': a != b, '<=': a <= b, '>=': a >= b, '<': a < b,
                  '>': a > b}[op]
        if not ok:
            return False
    return True


def _project_table(pyproject_path):
    """Return ``name`` and ``version`` of the ``[project]`` table (strings; missing -> None)."""
    with open(pyproject_path, 'rb') as f:
        data = f.read()
    try:
        import tomllib
    except ImportError:  # Python < 3.11: the two keys we need, read line by line
        found, table = {}, None
        for line in data.decode('utf-8').splitlines():
            line = line.strip()
            if line.startswith('['):
                table = line.strip('[] ')
            elif table == 'project':
                m = re.match(r'^(name|version)\s*=\s*(["\'])(.*?)\2\s*(?:#.*)?$', line)
                if m:
                    found[m.group(1)] = m.group(3)
        return found.get('name'), found.get('version')
    project = tomllib.loads(data.decode('utf-8')).get('project', {})
    name, version = project.get('name'), project.get('version')
    return (name if isinstance(name, str) else None,
            version if isinstance(version, str) else None)


def _file_url(path):
    """``file:`` URL of a local directory, spelt as pip spells a path given on its command line."""
    return urllib.parse.urljoin('file:', urllib.request.pathname2url(os.path.abspath(path)))


def _warn(message):
    sys.stderr.write('chainermn build backend: {}\n'.format(message))


def local_sibling(name, specifier, source_dir=SOURCE_DIR):
    """Return the directory of sibling ``name`` next to ``source_dir`` if it fits, else None.

    It fits when ``<parent of source_dir>/<name>/pyproject.toml`` declares that same project
    name and a version inside ``specifier``.
    """
    directory = os.path.join(os.path.dirname(os.path.abspath(source_dir)), _normalize(name))
    pyproject = os.path.join(directory, 'pyproject.toml')
    if not os.path.isfile(pyproject):
        return None
    try:
        declared, version = _project_table(pyproject)
    except (OSError, ValueError) as exc:
        _warn('cannot read {}: {}; keeping the version range'.format(pyproject, exc))
        return None
    if declared is None or _normalize(declared) != _normalize(name):
        _warn('{} declares project {!r}, not {!r}; keeping the version range'.format(
            pyproject, declared, name))
        return None
    if version is None or not version_satisfies(version, specifier):
        _warn('{} has version {!r}, outside {!r}; keeping the version range'.format(
            pyproject, version, specifier))
        return None
    return directory


def rewrite_requirement(requirement, source_dir=SOURCE_DIR):
    """Turn one ``Requires-Dist`` value into a direct reference when its sibling is local."""
    match = _REQUIREMENT.match(requirement.strip())
    if match is None or '@' in (match.group('bare') or ''):
        return requirement  # not understood, or already a direct reference
    name = match.group('name')
    specifier = (match.group('paren') if match.group('paren') is not None
                 else match.group('bare') or '').strip()
    directory = local_sibling(name, specifier, source_dir)
    if directory is None:
        return requirement
    line = '{}{} @ {}'.format(name, match.group('extras') or '', _file_url(directory))
    if match.group('marker'):
        line += ' ; ' + match.group('marker')  # a URL needs whitespace before the ';'
    return line


def rewrite_metadata(text, source_dir=SOURCE_DIR):
    """Rewrite every ``Requires-Dist`` header of a METADATA text whose sibling is local."""
    head, sep, body = text.partition('\n\n')  # headers end at the first blank line
    lines = head.split('\n')
    for i, line in enumerate(lines):
        if line.startswith('Requires-Dist:'):
            value = line[len('Requires-Dist:'):].strip()
            new = rewrite_requirement(value, source_dir)
            if new != value:
                lines[i] = 'Requires-Dist: ' + new
    return '\n'.join(lines) + sep + body


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    """Prepare poetry-core's metadata; in the checkout, point sibling requirements at it."""
    name = _poetry.prepare_metadata_for_build_wheel(metadata_directory, config_settings)
    if local_siblings_enabled():
        path = os.path.join(metadata_directory, name, 'METADATA')
        with open(path, encoding='utf-8', newline='') as f:
            text = f.read()
        new = rewrite_metadata(text)
        if new != text:
            with open(path, 'w', encoding='utf-8', newline='') as f:
                f.write(new)
    return name


# ---------------------------------------------------------------------------------------------
# Wheels: add the hook .pth, keep the metadata the frontend prepared.

def _record_line(name, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode('ascii')
    return '{},sha256={},{}'.format(name, digest, len(data))


def _dist_info(names, wheel_path):
    found = {n.split('/', 1)[0] for n in names if re.match(r'^[^/]+\.dist-info/RECORD$', n)}
    if len(found) != 1:
        raise RuntimeError('{}: expected one .dist-info/RECORD, found {}'.format(wheel_path, found))
    return found.pop()


def _patch_wheel(wheel_path, files):
    """Make the wheel hold ``files`` ({path in wheel: bytes, '{dist_info}' expanded}), fix RECORD."""
    with zipfile.ZipFile(wheel_path) as src:
        names = src.namelist()
        record = _dist_info(names, wheel_path) + '/RECORD'
        files = {k.format(dist_info=record.split('/')[0]): v for k, v in files.items()}
        changed = {n: d for n, d in files.items() if n not in names or src.read(n) != d}
        if not changed:
            return
        fd, tmp = tempfile.mkstemp(suffix='.whl', dir=os.path.dirname(wheel_path))
        os.close(fd)
        with zipfile.ZipFile(tmp, 'w', compression=zipfile.ZIP_DEFLATED) as dst:
            for info in src.infolist():
                if info.filename == record:
                    continue
                data = changed.get(info.filename, None)
                dst.writestr(info, src.read(info.filename) if data is None else data)
            for name in sorted(set(changed) - set(names)):
                dst.writestr(zipfile.ZipInfo(name, date_time=(2016, 1, 1, 0, 0, 0)), changed[name])
            lines = src.read(record).decode('utf-8').splitlines()
            lines = [ln for ln in lines
                     if ln and ln.rsplit(',', 2)[0] not in changed and ln.rsplit(',', 2)[0] != record]
            lines += [_record_line(n, changed[n]) for n in sorted(changed)] + [record + ',,']
            dst.writestr(src.getinfo(record), ('\n'.join(lines) + '\n').encode('utf-8'))
    shutil.move(tmp, wheel_path)


def _pth():
    with open(_PTH_SOURCE, 'rb') as f:
        return f.read()


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    """Build the wheel with poetry-core; it holds the hook .pth and the prepared METADATA."""
    name = _poetry.build_wheel(wheel_directory, config_settings, metadata_directory)
    files = {PTH_NAME: _pth()}
    if metadata_directory is not None:  # PEP 517: the wheel's metadata must match the prepared one
        with open(os.path.join(metadata_directory, 'METADATA'), 'rb') as f:
            files['{dist_info}/METADATA'] = f.read()
    _patch_wheel(os.path.join(wheel_directory, name), files)
    return name


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    """Build the editable wheel with poetry-core and add the hook .pth to it."""
    name = _poetry.build_editable(wheel_directory, config_settings, metadata_directory)
    _patch_wheel(os.path.join(wheel_directory, name), {PTH_NAME: _pth()})
    return name
