"""PEP 517/660 backend for the chainermn meta-package: poetry-core plus the import-precedence .pth.

poetry-core puts ``chainermn_precedence.pth`` into regular wheels through ``[tool.poetry] include``,
but its editable wheels hold only a path ``.pth`` and no included files.  This wrapper adds the hook
``.pth`` to every wheel that lacks it (rewriting RECORD), so ``pip install -e`` gets the same
``import chainermn`` precedence as ``pip install``.
"""

import base64
import hashlib
import os
import shutil
import tempfile
import zipfile

from poetry.core.masonry import api as _poetry

__all__ = ['build_editable', 'build_sdist', 'build_wheel', 'get_requires_for_build_editable',
           'get_requires_for_build_sdist', 'get_requires_for_build_wheel',
           'prepare_metadata_for_build_editable', 'prepare_metadata_for_build_wheel']

PTH_NAME = 'chainermn_precedence.pth'
_PTH_SOURCE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), PTH_NAME)

get_requires_for_build_wheel = _poetry.get_requires_for_build_wheel
get_requires_for_build_sdist = _poetry.get_requires_for_build_sdist
get_requires_for_build_editable = _poetry.get_requires_for_build_editable
prepare_metadata_for_build_wheel = _poetry.prepare_metadata_for_build_wheel
prepare_metadata_for_build_editable = _poetry.prepare_metadata_for_build_editable
build_sdist = _poetry.build_sdist


def _record_line(name, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode('ascii')
    return '{},sha256={},{}'.format(name, digest, len(data))


def _ensure_pth(wheel_path):
    """Add the hook .pth at the root of ``wheel_path`` (and to its RECORD) unless it is there."""
    with open(_PTH_SOURCE, 'rb') as f:
        pth = f.read()
    with zipfile.ZipFile(wheel_path) as src:
        names = src.namelist()
        if PTH_NAME in names:
            return
        record = [n for n in names if n.endswith('.dist-info/RECORD')]
        if len(record) != 1:
            raise RuntimeError('{}: expected one .dist-info/RECORD, found {}'.format(wheel_path, record))
        fd, tmp = tempfile.mkstemp(suffix='.whl', dir=os.path.dirname(wheel_path))
        os.close(fd)
        with zipfile.ZipFile(tmp, 'w', compression=zipfile.ZIP_DEFLATED) as dst:
            for info in src.infolist():
                if info.filename != record[0]:
                    dst.writestr(info, src.read(info.filename))
            dst.writestr(zipfile.ZipInfo(PTH_NAME, date_time=(2016, 1, 1, 0, 0, 0)), pth)
            lines = src.read(record[0]).decode('utf-8').splitlines()
            lines = [ln for ln in lines if ln and not ln.startswith(record[0] + ',')]
            lines += [_record_line(PTH_NAME, pth), record[0] + ',,']
            rec_info = src.getinfo(record[0])
            dst.writestr(rec_info, ('\n'.join(lines) + '\n').encode('utf-8'))
    shutil.move(tmp, wheel_path)


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    """Build the wheel with poetry-core and make sure the hook .pth is in it."""
    name = _poetry.build_wheel(wheel_directory, config_settings, metadata_directory)
    _ensure_pth(os.path.join(wheel_directory, name))
    return name


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    """Build the editable wheel with poetry-core and add the hook .pth to it."""
    name = _poetry.build_editable(wheel_directory, config_settings, metadata_directory)
    _ensure_pth(os.path.join(wheel_directory, name))
    return name
