"""Fixtures of the security suite: another user (uid 65534) plants things against root jobs.

Every case runs as root, with the unprivileged user ``nobody`` (65534, through ``setpriv``)
preparing the trap: symlinks at the names the library writes, files in directories anybody can
write, poisoned or oversized snapshots.  pytest's ``tmp_path`` lies under a 0700 directory that
uid 65534 cannot traverse, so the suite works in a root-owned 0755 directory under /tmp
(:func:`base`), removed afterwards.
"""

import os
import shutil
import subprocess
import sys
import tempfile

import pytest

NOBODY = 65534


def _setpriv():
    return shutil.which('setpriv')


def _need_root():
    if os.geteuid() != 0 or _setpriv() is None:
        pytest.skip('needs root and setpriv (util-linux) to act as another user (uid 65534)')


@pytest.fixture
def base():
    """A root-owned 0755 directory under /tmp that uid 65534 can traverse; removed afterwards."""
    _need_root()
    d = tempfile.mkdtemp(prefix='chainermn-sec-')
    os.chmod(d, 0o755)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _as_nobody(args, timeout=60):
    return subprocess.run([_setpriv(), '--reuid={}'.format(NOBODY), '--regid={}'.format(NOBODY),
                           '--clear-groups', sys.executable] + [str(a) for a in args],
                          capture_output=True, text=True, timeout=timeout, cwd='/')


@pytest.fixture
def as_nobody():
    """Return ``run(code, *args)``: run Python ``code`` as uid/gid 65534; assert it succeeded."""
    _need_root()
    probe = _as_nobody(['-c', 'import numpy'])
    if probe.returncode != 0:   # e.g. a checkout under a 0700 directory (mktemp -d): not the library's fault
        pytest.skip('uid {} cannot import numpy with {} (a directory above the venv is not searchable '
                    'by other users?): {}'.format(NOBODY, sys.executable,
                                                  (probe.stderr.strip().splitlines() or ['?'])[-1]))

    def run(code, *args):
        proc = _as_nobody(['-c', code] + list(args))
        assert proc.returncode == 0, 'planting as uid {} failed:\n{}'.format(NOBODY, proc.stderr)
        return proc.stdout
    return run


@pytest.fixture
def shared_dir(base):
    """Return ``make(name, mode=0o1777)``: a directory in ``base`` anybody can write (like /tmp)."""
    def make(name, mode=0o1777):
        d = os.path.join(base, name)
        os.mkdir(d)
        os.chmod(d, mode)
        return d
    return make


@pytest.fixture
def secret(base):
    """A root-only 0600 file that no write of the job may touch; checked by the test."""
    path = os.path.join(base, 'secret')
    with open(path, 'wb') as f:
        f.write(b'root only')
    os.chmod(path, 0o600)
    return path

