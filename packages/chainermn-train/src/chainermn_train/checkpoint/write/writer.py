"""How a snapshot file is written and removed: only through ``chainermn_comm.safe_files``.

A snapshot goes to a new file made exclusively under an unpredictable name in its directory
(never through a name someone planted), is ``fsync``-ed and renamed over its final name, and the
directory is ``fsync``-ed: a crash mid-write never leaves a file under a final name.  A staged
snapshot (one page-aligned buffer, ``staging``) is written with :func:`write_aligned`: straight from
its memory to the disk (``O_DIRECT``) where the file system allows it, so the writer thread spends
almost no CPU on it (no copy into the page cache, which on a machine whose cores all train would
slow training down).  Removing
(garbage collection, clean-up, stale temporary files) only ever unlinks regular files of this
user, never what a link points to.
"""

import errno
import fcntl
import os

from chainermn_comm import safe_files

from chainermn_train.checkpoint.write import background
from chainermn_train.checkpoint.write.background import kill_point

__all__ = ['write_atomically', 'write_aligned', 'set_aside', 'remove_file', 'remove_stale_tmp', 'TMP_SUFFIX',
           'BLOCK']

#: Suffix of the temporary files (``.<final name>.<random>.tmp``, see ``safe_files.atomic_write``).
TMP_SUFFIX = '.tmp'
#: The alignment of every write :func:`write_aligned` makes (address, offset and length).
BLOCK = 4096
#: Bytes per ``write`` call of :func:`write_aligned`.
_CHUNK = 16 << 20


class _KillMidWrite:
    """A file that kills the process (test hook ``mid-write``) once some bytes reached the disk."""

    def __init__(self, f, rank):
        self._f = f
        self._rank = rank

    def write(self, data):
        n = self._f.write(data)
        if self._f.tell() > 4096:
            self._f.flush()
            os.fsync(self._f.fileno())
            kill_point('mid-write', self._rank)
        return n

    def __getattr__(self, name):
        return getattr(self._f, name)


def write_atomically(final, write, rank=None, raw=False, reuse=None):
    """Call ``write(file)`` on a new temporary file, then rename it to ``final``; return its size.

    ``rank`` (a snapshot's writer) enables the crash tests' kill points (``background``); ``raw``
    makes the file unbuffered (for :func:`write_aligned`); ``reuse``: a file :func:`set_aside`
    set aside, written over instead of a new one where it still may be.
    """
    if rank is not None and not background.kill_at:
        rank = None
    with safe_files.atomic_write(final, raw=raw, reuse=reuse) as f:
        write(f if rank is None else _KillMidWrite(f, rank))
        f.flush()
        size = f.tell()
        if rank is not None:
            os.fsync(f.fileno())
            kill_point('before-rename', rank)   # written and fsync-ed, not renamed yet
    if rank is not None:
        kill_point('after-rename', rank)
    return size


def _direct(fd, on):
    """Turn ``O_DIRECT`` on or off for ``fd``; return whether it is on."""
    flag = getattr(os, 'O_DIRECT', 0)
    if not flag:
        return False
    flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    try:
        fcntl.fcntl(fd, fcntl.F_SETFL, (flags | flag) if on else (flags & ~flag))
    except OSError:   # the file system has no direct I/O (tmpfs on older kernels, some FUSE)
        return False
    return on


def write_aligned(f, data, size):
    """Write ``data[:size]`` to the new, empty unbuffered file ``f``; return ``size``.

    ``data`` (a buffer) starts at a :data:`BLOCK` boundary and holds at least ``size`` rounded up
    to a block: every write is whole blocks, straight from ``data`` to the disk where the file
    system takes ``O_DIRECT``, through the page cache where it does not; the file is then cut to
    ``size``.
    """
    fd = f.fileno()
    end = -(-size // BLOCK) * BLOCK
    view = memoryview(data).cast('B')[:end]
    direct = _direct(fd, True)
    try:
        pos = 0
        while pos < end:
            try:
                pos += f.write(view[pos:pos + _CHUNK])
            except OSError as e:
                if not direct or e.errno != errno.EINVAL:
                    raise
                direct = _direct(fd, False)   # this file system took the flag, not the write
    finally:
        if direct:
            _direct(fd, False)
    os.ftruncate(fd, size)
    os.lseek(fd, size, os.SEEK_SET)
    return size


def set_aside(path, prefix):
    """Take the old snapshot ``path`` out of sight for the next write to write over; return its new path.

    Its disk blocks stay allocated: no large file is freed (on a file system mounted with
    ``discard``, freeing one holds the disk for tens of milliseconds, which training feels) and
    none is allocated again.  A crash leaves it as a temporary file (``prefix``), removed with the
    others.  None: ``path`` is not a regular file of this user, and is left as it was.
    """
    return safe_files.set_aside(path, prefix)


def remove_file(path):
    """Remove ``path`` if it is a regular file of this user; return whether it was removed."""
    return safe_files.remove_own(path)


def remove_stale_tmp(directory, prefix):
    """Remove this user's temporary files starting with ``prefix`` that a crashed writer left.

    Those of the records named ``prefix...`` too (the complete, owner and made records: their
    temporary files start with one more dot, ``.<record name>.<random>.tmp``).  Only regular files
    of this user are removed; links and other users' files stay.
    """
    try:
        entries = os.listdir(directory)
    except FileNotFoundError:
        return
    for fn in entries:
        if (fn.startswith(prefix) or fn.startswith('.' + prefix)) and fn.endswith(TMP_SUFFIX):
            safe_files.remove_own(os.path.join(directory, fn))
