"""The one safe writer and the trust checks (chainermn_comm.safe_files), as root and as another user."""

import os
import shutil
import stat
import subprocess
import sys

import pytest

from chainermn_comm import safe_files
from chainermn_comm.safe_files import UntrustedPathError

NOBODY = 65534
root_only = pytest.mark.skipif(os.geteuid() != 0, reason='needs root to act as another user')


def as_nobody(*cmd):
    """Run ``cmd`` as uid/gid 65534 (setpriv); return the completed process."""
    return subprocess.run(['setpriv', '--reuid={}'.format(NOBODY), '--regid={}'.format(NOBODY),
                           '--clear-groups'] + list(cmd), capture_output=True, text=True, timeout=30)


@pytest.fixture
def reachable_dir():
    """A root-owned 0755 directory under /tmp that another user can traverse (tmp_path cannot)."""
    import tempfile
    d = tempfile.mkdtemp(prefix='chainermn-safe-')
    os.chmod(d, 0o755)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def test_atomic_write_mode_follows_umask_and_replaces(tmp_path):
    target = tmp_path / 'f.bin'
    old = os.umask(0o027)
    try:
        safe_files.write_bytes(str(target), b'abc')
    finally:
        os.umask(old)
    assert target.read_bytes() == b'abc'
    assert stat.S_IMODE(target.stat().st_mode) == 0o640
    safe_files.write_text(str(target), 'xyz', mode=0o600)
    assert target.read_text() == 'xyz'
    assert stat.S_IMODE(target.stat().st_mode) == 0o600 & ~old
    assert sorted(os.listdir(tmp_path)) == ['f.bin']


def test_atomic_write_error_leaves_old_file_and_no_temporary(tmp_path):
    target = tmp_path / 'f.bin'
    target.write_bytes(b'old')
    with pytest.raises(RuntimeError):
        with safe_files.atomic_write(str(target)) as f:
            f.write(b'new')
            raise RuntimeError('boom')
    assert target.read_bytes() == b'old'
    assert sorted(os.listdir(tmp_path)) == ['f.bin']


def test_planted_symlink_is_replaced_not_followed(tmp_path):
    secret = tmp_path / 'secret'
    secret.write_bytes(b'root only')
    os.chmod(secret, 0o600)
    link = tmp_path / 'snap'
    link.symlink_to(secret)
    safe_files.write_bytes(str(link), b'snapshot')
    assert secret.read_bytes() == b'root only'
    assert not os.path.islink(link) and link.read_bytes() == b'snapshot'


def test_open_lock_refuses_symlink_and_reuses_own(tmp_path):
    victim = tmp_path / 'victim'
    victim.write_bytes(b'v')
    (tmp_path / 'l1').symlink_to(victim)
    with pytest.raises(UntrustedPathError, match='symbolic link'):
        safe_files.open_lock(str(tmp_path / 'l1'))
    fd = safe_files.open_lock(str(tmp_path / 'l2'))
    os.close(fd)
    fd = safe_files.open_lock(str(tmp_path / 'l2'))
    os.close(fd)
    assert victim.read_bytes() == b'v'


def test_open_trusted_refuses_symlink_fifo_and_wide_file(tmp_path):
    f = tmp_path / 'data'
    f.write_bytes(b'x')
    os.chmod(f, 0o644)
    with safe_files.open_trusted(str(f)) as r:
        assert r.read() == b'x'
    (tmp_path / 'ln').symlink_to(f)
    with pytest.raises(UntrustedPathError, match='symbolic link'):
        safe_files.open_trusted(str(tmp_path / 'ln'))
    os.mkfifo(tmp_path / 'fifo')
    with pytest.raises(UntrustedPathError, match='not a regular file'):
        safe_files.open_trusted(str(tmp_path / 'fifo'))
    os.chmod(f, 0o666)
    with pytest.raises(UntrustedPathError, match='other users can write it') as e:
        safe_files.open_trusted(str(f), what='snapshot')
    assert str(f) in str(e.value) and 'mode 0666' in str(e.value)
    assert safe_files.open_trusted(str(f), allow_shared=True).read() == b'x'


def test_check_directory_refuses_world_writable_even_sticky(tmp_path, monkeypatch):
    monkeypatch.delenv(safe_files.TRUST_SHARED_ENV, raising=False)
    d = tmp_path / 'shared'
    d.mkdir()
    os.chmod(d, 0o1777)
    with pytest.raises(UntrustedPathError) as e:
        safe_files.check_directory(str(d), 'checkpoint directory')
    msg = str(e.value)
    assert str(d) in msg and 'mode 1777' in msg and 'mkdir -m 700' in msg
    assert safe_files.TRUST_SHARED_ENV in msg
    monkeypatch.setenv(safe_files.TRUST_SHARED_ENV, '1')
    safe_files.check_directory(str(d))
    os.chmod(d, 0o700)
    monkeypatch.delenv(safe_files.TRUST_SHARED_ENV)
    safe_files.check_directory(str(d))
    os.chmod(tmp_path, 0o777)          # a parent that anybody can rename entries in
    try:
        with pytest.raises(UntrustedPathError, match='above it'):
            safe_files.check_directory(str(d))
    finally:
        os.chmod(tmp_path, 0o700)


@root_only
def test_directory_and_file_of_another_user_refused_for_root(tmp_path):
    os.chmod(tmp_path, 0o755)
    d = tmp_path / 'theirs'
    d.mkdir()
    os.chown(d, NOBODY, NOBODY)
    os.chmod(d, 0o700)
    with pytest.raises(UntrustedPathError, match='owned by another user') as e:
        safe_files.check_directory(str(d))
    assert 'uid 65534' in str(e.value)
    f = tmp_path / 'planted'
    f.write_bytes(b'x')
    os.chown(f, NOBODY, NOBODY)
    with pytest.raises(UntrustedPathError, match='owned by another user'):
        safe_files.open_trusted(str(f))


@root_only
def test_other_user_cannot_redirect_root_writes(reachable_dir):
    """nobody plants a symlink at every name it can guess in a 1777 dir; root's write stays put."""
    import pathlib
    tmp_path = pathlib.Path(reachable_dir)
    shared = tmp_path / 'scratch'
    shared.mkdir()
    os.chmod(shared, 0o1777)
    secret = tmp_path / 'secret'
    secret.write_bytes(b'root only')
    os.chmod(secret, 0o600)
    plant = ('import os, sys\n'
             'd, t = sys.argv[1], sys.argv[2]\n'
             'for n in ["out", ".out.tmp", ".out.{}.tmp".format(os.getppid())]:\n'
             '    os.symlink(t, os.path.join(d, n))\n')
    r = as_nobody(sys.executable, '-c', plant, str(shared), str(secret))
    assert r.returncode == 0, r.stderr
    safe_files.write_bytes(str(shared / 'out'), b'snapshot')
    assert secret.read_bytes() == b'root only'
    st = os.lstat(shared / 'out')
    assert stat.S_ISREG(st.st_mode) and st.st_uid == 0


def test_open_new_makes_a_new_file_only(tmp_path):
    target = tmp_path / 'node.log'
    old = os.umask(0o022)
    try:
        fd = safe_files.open_new(str(target), mode=0o600)
    finally:
        os.umask(old)
    os.write(fd, b'a')
    os.close(fd)
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o600 and target.read_bytes() == b'a'
    with pytest.raises(FileExistsError):
        safe_files.open_new(str(target))
    victim = tmp_path / 'victim'
    victim.write_bytes(b'keep')
    os.symlink(str(victim), str(tmp_path / 'planted.log'))
    with pytest.raises(FileExistsError):
        safe_files.open_new(str(tmp_path / 'planted.log'))
    assert victim.read_bytes() == b'keep'


def test_make_directory_is_private_under_any_umask_and_checked(tmp_path, monkeypatch):
    monkeypatch.delenv(safe_files.TRUST_SHARED_ENV, raising=False)
    old = os.umask(0)
    try:
        safe_files.make_directory(str(tmp_path / 'a' / 'b'), 'test directory')
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / 'a' / 'b').st_mode) == 0o755
    (tmp_path / 'wide').mkdir()
    os.chmod(tmp_path / 'wide', 0o777)
    with pytest.raises(UntrustedPathError, match='refusing the test directory'):
        safe_files.make_directory(str(tmp_path / 'wide'), 'test directory')


def test_remove_own_removes_only_regular_files_never_through_links(tmp_path):
    target = tmp_path / 'target'
    target.write_bytes(b't')
    (tmp_path / 'link').symlink_to(target)
    (tmp_path / 'dir').mkdir()
    (tmp_path / 'file').write_bytes(b'f')
    assert safe_files.remove_own(str(tmp_path / 'link')) is False
    assert safe_files.remove_own(str(tmp_path / 'dir')) is False
    assert safe_files.remove_own(str(tmp_path / 'gone')) is False
    assert safe_files.remove_own(str(tmp_path / 'file')) is True
    assert sorted(os.listdir(tmp_path)) == ['dir', 'link', 'target'] and target.read_bytes() == b't'


@root_only
def test_remove_own_leaves_another_users_file(tmp_path):
    f = tmp_path / 'theirs'
    f.write_bytes(b'x')
    os.chown(f, NOBODY, NOBODY)
    assert safe_files.is_own_file(str(f)) is False and safe_files.remove_own(str(f)) is False
    assert f.exists()
