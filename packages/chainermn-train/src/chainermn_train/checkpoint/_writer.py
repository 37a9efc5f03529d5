"""How a snapshot file is written: to a hidden temporary file, fsync-ed, renamed over its final name.

A crash mid-write therefore never leaves a file under a final name (the directory is fsync-ed
after the rename so that the name survives a power loss too).
"""

import os

__all__ = ['write_atomically', 'fsync_dir', 'remove_file', 'remove_stale_tmp']


def fsync_dir(path):
    """Flush the directory ``path`` (its entries) to disk; ignore file systems that cannot."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_atomically(final, tmp, write):
    """Call ``write(file)`` on ``tmp``, then rename it to ``final``; return the bytes written.

    ``tmp`` must be in the directory of ``final``; it is removed when ``write`` fails.
    """
    try:
        with open(tmp, 'wb') as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
            size = f.tell()
        os.replace(tmp, final)
    except BaseException:
        try:
            os.remove(tmp)
        except OSError:
            pass
        raise
    fsync_dir(os.path.dirname(final))
    return size


def remove_file(path):
    """Remove ``path``; return False when it was already gone."""
    try:
        os.remove(path)
    except FileNotFoundError:
        return False
    return True


def remove_stale_tmp(directory, prefix):
    """Remove the temporary files starting with ``prefix`` that a crashed writer left in ``directory``."""
    try:
        entries = os.listdir(directory)
    except FileNotFoundError:
        return
    for fn in entries:
        if fn.startswith(prefix) and '.tmp' in fn:
            try:
                os.remove(os.path.join(directory, fn))
            except OSError:
                pass
