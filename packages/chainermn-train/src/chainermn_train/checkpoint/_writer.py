"""How a snapshot file is written and removed: only through ``chainermn_comm.safe_files``.

A snapshot goes to a new file made exclusively under an unpredictable name in its directory
(never through a name someone planted), is ``fsync``-ed and renamed over its final name, and the
directory is ``fsync``-ed: a crash mid-write never leaves a file under a final name.  Removing
(garbage collection, clean-up, stale temporary files) only ever unlinks regular files of this
user, never what a link points to.
"""

import os

from chainermn_comm import safe_files

__all__ = ['write_atomically', 'remove_file', 'remove_stale_tmp', 'TMP_SUFFIX']

#: Suffix of the temporary files (``.<final name>.<random>.tmp``, see ``safe_files.atomic_write``).
TMP_SUFFIX = '.tmp'


def write_atomically(final, write):
    """Call ``write(file)`` on a new temporary file, then rename it to ``final``; return its size."""
    with safe_files.atomic_write(final) as f:
        write(f)
        f.flush()
        size = f.tell()
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
