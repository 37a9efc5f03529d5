"""Write files safely and trust only what this user owns: the one writer and checker of the project.

Every file chainermn writes (snapshots, trace parts, the merged trace, lock files, the launcher's
status file, the cluster registry) goes through :func:`atomic_write` or :func:`open_lock` (or,
for a log that another process appends to, :func:`open_new`):

- the bytes go to a new file made with ``O_CREAT|O_EXCL|O_NOFOLLOW`` under an unpredictable name
  in the target directory (``tempfile.mkstemp``), so a name planted by someone else (a symlink, a
  file, a FIFO) is never followed, reused or written through;
- the file is ``fsync``-ed, renamed over the final name (``os.replace`` replaces a planted symlink
  itself, never its target) and the directory is ``fsync``-ed;
- its mode comes from the umask (``0o644 & ~umask`` by default: never writable by group or others,
  since chainermn refuses to read state files that others can write), never wider than asked.

Every directory and file chainermn reads state from is checked first (:func:`check_directory`,
:func:`open_trusted`): a directory owned by another user or writable by other users (sticky or
not), and a file owned by another user or writable by others, are refused with one message naming
the path, its owner and mode, and the fix. ``CHAINERMN_TRUST_SHARED=1`` (or ``allow_shared=True``
where an API offers it) is the explicit opt-in for people who really share a directory. Root jobs
follow the same rules.

This module is comm's named internal API for its sibling packages (train, tools).
"""

import contextlib
import errno
import grp
import os
import pwd
import secrets
import stat
import tempfile

from chainermn_comm import settings
from chainermn_comm.protocol import TRUST_SHARED_ENV

__all__ = ['UntrustedPathError', 'TRUST_SHARED_ENV', 'atomic_write', 'write_bytes', 'write_text',
           'open_lock', 'open_new', 'fsync_dir', 'current_umask', 'check_directory', 'check_file',
           'open_trusted', 'shared_allowed', 'describe_owner', 'make_directory', 'remove_own',
           'is_own_file', 'set_aside']

_FIX = ('Use a directory that only you can write (for example `mkdir -m 700 DIR`), or, if you '
        'really share it with people you trust, set {}=1.'.format(TRUST_SHARED_ENV))


class UntrustedPathError(PermissionError):
    """A directory or file that another user owns or can write, refused."""


def shared_allowed(allow_shared=None):
    """Return whether shared (other-user) paths are trusted: ``allow_shared``, else the variable."""
    if allow_shared is not None:
        return bool(allow_shared)
    return bool(settings.read(TRUST_SHARED_ENV))


def current_umask():
    """Return this process's umask without changing it (``/proc``; else a quick swap)."""
    try:
        with open('/proc/self/status') as f:
            for line in f:
                if line.startswith('Umask:'):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o22)
    os.umask(mask)
    return mask


def fsync_dir(path):
    """Flush the directory ``path`` (its entries) to disk; ignore file systems that cannot."""
    try:
        fd = os.open(path or '.', os.O_RDONLY | getattr(os, 'O_DIRECTORY', 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _reusable(path, directory):
    """Return ``path`` opened to be written over, or None unless it may be (see :func:`atomic_write`)."""
    if path is None or os.path.dirname(os.path.abspath(path)) != directory:
        return None
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, 'O_CLOEXEC', 0))
    except OSError:
        return None
    st = os.fstat(fd)
    if (not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_nlink != 1
            or st.st_mode & 0o022):
        os.close(fd)
        return None
    return fd


@contextlib.contextmanager
def atomic_write(path, mode=0o644, text=False, raw=False, reuse=None):
    """Yield a new file that replaces ``path`` atomically when the block ends without an error.

    The file is made exclusively (no-follow, unpredictable name) in ``path``'s directory, written,
    ``fsync``-ed and renamed into place; its mode is ``mode & ~umask``. On an error it is removed
    and ``path`` is left as it was.  ``raw``: the file is unbuffered (each ``write`` is one system
    call, which may write less than it is given; for writers that align their writes).
    ``reuse``: a file this process set aside under an unpredictable name in the same directory
    (``set_aside``), written over from its start and cut where the block leaves it instead of a
    new one being made (its disk blocks are neither freed nor allocated again); it is used only
    while it is still a regular file of this user with one link that no one else may write.
    """
    directory, base = os.path.split(os.path.abspath(path))
    fd = _reusable(reuse, directory)
    tmp = reuse
    if fd is None:
        fd, tmp = tempfile.mkstemp(prefix='.{}.'.format(base), suffix='.tmp', dir=directory)
        reuse = None
    try:
        os.fchmod(fd, mode & ~current_umask() & 0o777)
        with os.fdopen(fd, 'w' if text else 'wb', buffering=0 if raw and not text else -1) as f:
            fd = None
            yield f
            f.flush()
            if reuse is not None:
                f.truncate()   # what is left of the file it was is cut off
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if fd is not None:
            os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_dir(directory)


def set_aside(path, prefix):
    """Rename this user's regular file ``path`` to a new unpredictable ``<prefix>...tmp`` name beside it.

    Return the new path, or None when ``path`` is not such a file (then nothing was renamed).  The
    file is then no longer under a name anyone reads; ``atomic_write(..., reuse=)`` writes over it.
    """
    if not is_own_file(path):
        return None
    directory = os.path.dirname(os.path.abspath(path))
    new = os.path.join(directory, '{}{}.tmp'.format(prefix, secrets.token_hex(8)))
    try:
        os.rename(path, new)
    except OSError:
        return None
    return new


def write_bytes(path, data, mode=0o644):
    """Write ``data`` (bytes) to ``path`` through :func:`atomic_write`; return its length."""
    with atomic_write(path, mode=mode) as f:
        f.write(data)
    return len(data)


def write_text(path, text, mode=0o644):
    """Write ``text`` to ``path`` through :func:`atomic_write`."""
    with atomic_write(path, mode=mode, text=True) as f:
        f.write(text)


def open_lock(path, mode=0o644, allow_shared=None):
    """Return a file descriptor for the lock file ``path`` (for ``fcntl.flock``), made if missing.

    Made exclusively and never through a symlink; an existing one must be a regular file of this
    user that others cannot write (:class:`UntrustedPathError` otherwise).
    """
    flags = os.O_RDWR | os.O_NOFOLLOW | getattr(os, 'O_CLOEXEC', 0)
    try:
        fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, mode & ~current_umask() & 0o777)
        return fd
    except FileExistsError:
        pass
    try:
        fd = os.open(path, flags | os.O_NONBLOCK)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise UntrustedPathError('chainermn: refusing the lock file {}: it is a symbolic link '
                                     '(someone planted it). Remove it, and use a directory that only '
                                     'you can write.'.format(path)) from None
        raise
    try:
        check_file(os.fstat(fd), path, 'lock file', allow_shared=allow_shared)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_new(path, mode=0o666):
    """Return a write-only, appending file descriptor of a new file ``path`` (a log another process writes).

    Made exclusively and never through a symlink (``FileExistsError`` if anything is at ``path``);
    its mode is ``mode & ~umask``.
    """
    flags = (os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
             | getattr(os, 'O_CLOEXEC', 0))
    return os.open(path, flags, mode & ~current_umask() & 0o777)


def make_directory(path, what='directory', allow_shared=None):
    """Create ``path`` (and its parents) if missing, then :func:`check_directory` it.

    Every directory made here (parents included) gets the umask's mode without group or other
    write (``0o755 & ~umask``), so that it passes the check even under a umask of 0.  Returns the
    absolute paths of the directories this call made, outermost first (empty: all existed).
    """
    missing = []
    here = os.path.abspath(path)
    while not os.path.lexists(here):
        missing.append(here)
        here = os.path.dirname(here)
    made = []
    for d in reversed(missing):
        try:
            os.mkdir(d, 0o755)
            made.append(d)
        except FileExistsError:   # made meanwhile (another rank): checked below like any other
            pass
    check_directory(path, what, allow_shared=allow_shared)
    return made


def is_own_file(path):
    """Return whether ``path`` itself (never what a link points to) is a regular file of this user."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid()


def remove_own(path):
    """Remove ``path`` if it is a regular file of this user; return whether it was removed.

    Links, directories, FIFOs and other users' files are left alone (never followed): only what
    this user wrote is ever deleted.
    """
    if not is_own_file(path):
        return False
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    return True


def describe_owner(uid):
    """Return ``'uid 65534 (nobody)'`` for ``uid``."""
    try:
        return 'uid {} ({})'.format(uid, pwd.getpwuid(uid).pw_name)
    except KeyError:
        return 'uid {}'.format(uid)


def _private_group(st):
    # A group-writable entry is still private when its group is the owner's own group with no
    # other members (the "user private group" that a umask of 002 is meant for).
    try:
        group = grp.getgrgid(st.st_gid)
        owner = pwd.getpwuid(st.st_uid)
    except KeyError:
        return False
    return not group.gr_mem and group.gr_name == owner.pw_name and owner.pw_gid == st.st_gid


def _writable_by_others(st):
    return bool(st.st_mode & stat.S_IWOTH) or (bool(st.st_mode & stat.S_IWGRP)
                                               and not _private_group(st))


def _refuse(what, path, st, why):
    raise UntrustedPathError('chainermn: refusing the {} {}: {} (owner {}, mode {:04o}); another '
                             'user could plant or replace files there. {}'.format(
                                 what, path, why, describe_owner(st.st_uid),
                                 stat.S_IMODE(st.st_mode), _FIX))


def _problem(st, uid):
    if st.st_uid != uid:
        return 'it is owned by another user'
    if _writable_by_others(st):
        return 'other users can write it'
    return None


def check_directory(path, what='directory', allow_shared=None):
    """Raise :class:`UntrustedPathError` unless ``path`` is a directory only this user can write.

    Its owner must be this user and no other user may write it (sticky or not). A symbolic link to
    it must belong to this user or root, and no directory above it may be writable by everybody
    without the sticky bit (anybody could swap it). ``allow_shared`` (default: ``CHAINERMN_TRUST_SHARED``)
    skips the check.
    """
    if shared_allowed(allow_shared):
        return
    uid = os.geteuid()
    lst = os.lstat(path)
    if stat.S_ISLNK(lst.st_mode) and lst.st_uid not in (uid, 0):
        _refuse(what, path, lst, 'it is a symbolic link made by another user')
    st = os.stat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise NotADirectoryError('chainermn: the {} {} is not a directory.'.format(what, path))
    why = _problem(st, uid)
    if why:
        _refuse(what, path, st, why)
    real = os.path.realpath(path)
    parent = os.path.dirname(real)
    while True:
        pst = os.stat(parent)
        if pst.st_mode & stat.S_IWOTH and not pst.st_mode & stat.S_ISVTX:
            _refuse(what, path, pst, 'the directory {} above it can be written by other users '
                    'without the sticky bit'.format(parent))
        up = os.path.dirname(parent)
        if up == parent:
            return
        parent = up


def check_file(st, path, what='file', allow_shared=None):
    """Raise unless ``st`` (an ``os.stat_result`` of ``path``) is a regular file of this user that others cannot write."""
    if not stat.S_ISREG(st.st_mode):
        raise UntrustedPathError('chainermn: refusing the {} {}: it is not a regular file. Remove '
                                 'it.'.format(what, path))
    if shared_allowed(allow_shared):
        return
    why = _problem(st, os.geteuid())
    if why:
        _refuse(what, path, st, why)


def open_trusted(path, what='file', allow_shared=None):
    """Open ``path`` for reading (binary) after :func:`check_file`; never through a symlink or into a FIFO."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, 'O_CLOEXEC', 0)
    try:
        fd = os.open(path, flags)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise UntrustedPathError('chainermn: refusing the {} {}: it is a symbolic link. Remove '
                                     'it, or copy the file it points to in its place.'.format(
                                         what, path)) from None
        raise
    try:
        check_file(os.fstat(fd), path, what, allow_shared=allow_shared)
        os.set_blocking(fd, True)
        return os.fdopen(fd, 'rb')
    except BaseException:
        os.close(fd)
        raise
