"""The directories a checkpointer made: a completed run removes them again when they are empty.

When a rank's checkpointer creates its directory, it writes ``<path>/.<name>.<rank>.made``
(through ``chainermn_comm.safe_files``): the directory, with its device and inode and those of its
parent.  Missing parents it made are not recorded and stay: a program writes into them after
training (Chainer's ``Trainer`` out, a final ``save_npz``).  The record outlives a killed run, so the run
that resumes and completes removes what the first one made.  At the end of a completed run every
rank removes its own snapshots and owner record, then :func:`remove_if_empty`: when nothing but
such records is left in the directory (the last rank to finish sees that), the records are
removed and each directory they name is removed if it is empty, innermost first.  No collective
is needed: a rank that finds another rank's files still there leaves the directory to it.
A directory the user made (or the current directory) has no record and is never removed; a
directory is removed only by name inside a parent opened without following links whose device
and inode are the recorded ones, and only when it is the recorded directory itself (``rmdir``
never follows a link).
"""

import json
import os
import re
import stat

from chainermn_comm import safe_files

__all__ = ['record_path', 'record', 'remove_if_empty']

_LIMIT = 1 << 16


def record_path(directory, name, rank):
    """Return the path of rank ``rank``'s record of the directories it made for snapshots ``name``."""
    return os.path.join(directory, '.{}.{}.made'.format(name, int(rank)))


def _identity(path):
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        return None
    return [st.st_dev, st.st_ino]


def _read(path, allow_shared):
    try:
        with safe_files.open_trusted(path, 'checkpoint directory record', allow_shared=allow_shared) as f:
            entries = json.loads(f.read(_LIMIT).decode('utf-8'))
    except (OSError, ValueError):
        return []
    return [e for e in entries if isinstance(e, dict) and isinstance(e.get('path'), str)] \
        if isinstance(entries, list) else []


def record(directory, name, rank, made, allow_shared=None):
    """Note the directories ``made`` (absolute paths) in rank ``rank``'s record; best effort."""
    entries = []
    for path in made:
        try:
            me, parent = _identity(path), _identity(os.path.dirname(path))
        except OSError:
            continue
        if me is not None and parent is not None:
            entries.append({'path': path, 'id': me, 'parent': parent})
    if not entries:
        return
    where = record_path(directory, name, rank)
    known = {e['path'] for e in entries}
    entries = [e for e in _read(where, allow_shared) if e['path'] not in known] + entries
    try:
        safe_files.write_text(where, json.dumps(entries))
    except OSError:   # the directory then stays after the run; nothing else depends on it
        pass


def _rmdir(entry):
    """Remove the recorded directory if it is empty, still the recorded one, in its recorded parent."""
    parent, base = os.path.split(entry['path'])
    flags = os.O_RDONLY | getattr(os, 'O_DIRECTORY', 0) | getattr(os, 'O_NOFOLLOW', 0) | \
        getattr(os, 'O_CLOEXEC', 0)
    try:
        fd = os.open(parent, flags)
    except OSError:
        return
    try:
        st = os.fstat(fd)
        if [st.st_dev, st.st_ino] != entry.get('parent'):
            return
        st = os.stat(base, dir_fd=fd, follow_symlinks=False)
        if not stat.S_ISDIR(st.st_mode) or [st.st_dev, st.st_ino] != entry.get('id') or \
                st.st_uid != os.geteuid():
            return
        os.rmdir(base, dir_fd=fd)
    except OSError:   # not empty (another checkpointer, the trainer's files), or gone already
        pass
    finally:
        os.close(fd)


def remove_if_empty(directory, name, allow_shared=None):
    """When ``directory`` holds only the made-records of ``name``, remove them and the directories they name."""
    pattern = re.compile(r'\.{}\.\d+\.made\Z'.format(re.escape(name)))
    try:
        entries = os.listdir(directory)
    except OSError:
        return
    records = [e for e in entries if pattern.match(e)]
    if not records or len(records) != len(entries):
        return
    made = {}
    for fn in records:
        for e in _read(os.path.join(directory, fn), allow_shared):
            made[e['path']] = e
    for fn in records:
        safe_files.remove_own(os.path.join(directory, fn))
    for path in sorted(made, key=lambda p: p.count(os.sep), reverse=True):
        _rmdir(made[path])
