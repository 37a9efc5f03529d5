"""How a snapshot file is written and removed: only through ``chainermn_comm.safe_files``.

A snapshot goes to a new file made exclusively under an unpredictable name in its directory
(never through a name someone planted), is ``fsync``-ed and renamed over its final name, and the
directory is ``fsync``-ed: a crash mid-write never leaves a file under a final name.  Removing
(garbage collection, clean-up, stale temporary files) only ever unlinks regular files of this
user, never what a link points to.
"""

import os

from chainermn_comm import safe_files

from chainermn_train.checkpoint.write import background
from chainermn_train.checkpoint.write.background import kill_point

__all__ = ['write_atomically', 'remove_file', 'remove_stale_tmp', 'TMP_SUFFIX']

#: Suffix of the temporary files (``.<final name>.<random>.tmp``, see ``safe_files.atomic_write``).
TMP_SUFFIX = '.tmp'


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


def write_atomically(final, write, rank=None):
    """Call ``write(file)`` on a new temporary file, then rename it to ``final``; return its size.

    ``rank`` (a snapshot's writer) enables the crash tests' kill points (``background``).
    """
    if rank is not None and not background.kill_at:
        rank = None
    with safe_files.atomic_write(final) as f:
        write(f if rank is None else _KillMidWrite(f, rank))
        f.flush()
        size = f.tell()
        if rank is not None:
            os.fsync(f.fileno())
            kill_point('before-rename', rank)   # written and fsync-ed, not renamed yet
    if rank is not None:
        kill_point('after-rename', rank)
    return size


def remove_file(path):
    """Remove ``path`` if it is a regular file of this user; return whether it was removed."""
    return safe_files.remove_own(path)


def remove_stale_tmp(directory, prefix):
    """Remove this user's temporary files starting with ``prefix`` that a crashed writer left.

    Only regular files of this user are removed; links and other users' files stay.
    """
    try:
        entries = os.listdir(directory)
    except FileNotFoundError:
        return
    for fn in entries:
        if fn.startswith(prefix) and fn.endswith(TMP_SUFFIX):
            safe_files.remove_own(os.path.join(directory, fn))
