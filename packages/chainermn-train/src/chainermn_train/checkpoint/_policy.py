"""What the checkpointer may trust: pickle only when the user opts in, and a directory only they write.

Also the checkpointer's warning and error classes, so that every checkpoint module raises the same.
"""

import os
import stat
import warnings

from chainermn_comm import protocol, settings

__all__ = ['CheckpointWarning', 'SnapshotUnusableError', 'UnsafeCheckpointError', 'ALLOW_PICKLE_ENV',
           'START_FRESH_ENV', 'OPT_IN_HINT', 'allow_pickle', 'start_fresh', 'warn_pickle_once',
           'directory_problem']

#: Environment variable that lets ``maybe_load`` unpickle snapshots (``1``) when the code does not
#: pass ``allow_pickle``; only for files you trust.
ALLOW_PICKLE_ENV = protocol.ALLOW_PICKLE_ENV
#: Environment variable that lets ``maybe_load`` start from iteration 0 (``1``) when snapshots
#: exist but none can be used (default: raise :class:`SnapshotUnusableError`).
START_FRESH_ENV = protocol.START_FRESH_ENV

OPT_IN_HINT = ('if you trust the file(s), opt in to pickle with create_multi_node_checkpointer(..., '
               'allow_pickle=True), maybe_load(..., allow_pickle=True) or {}=1; otherwise remove '
               'them'.format(ALLOW_PICKLE_ENV))
_pickle_warned = False  # the opt-in warns once per process


class CheckpointWarning(UserWarning):
    """Warned when a snapshot cannot be used, when pickle is used, or for an unsafe directory."""


class SnapshotUnusableError(RuntimeError):
    """Raised by ``maybe_load`` when snapshots exist but none can be used (nothing is deleted)."""


class UnsafeCheckpointError(SnapshotUnusableError):
    """Raised by ``maybe_load`` when no snapshot can be loaded and some were refused for pickle."""


def allow_pickle(explicit):
    """Return ``(allowed, how)``: the explicit argument if given, else ``$CHAINERMN_ALLOW_PICKLE``."""
    if explicit is not None:
        return bool(explicit), 'the allow_pickle=True argument'
    allowed = settings.read(ALLOW_PICKLE_ENV)
    return allowed, '{}={}'.format(ALLOW_PICKLE_ENV, int(allowed))


def start_fresh(explicit):
    """Return whether to start from iteration 0 when no snapshot can be used."""
    if explicit is not None:
        return bool(explicit)
    return settings.read(START_FRESH_ENV)


def warn_pickle_once(rank, path, keys, how):
    """Warn, once per process, that keys of ``path`` were unpickled and why that was allowed."""
    global _pickle_warned
    if _pickle_warned:
        return
    _pickle_warned = True
    warnings.warn('rank {}: unpickled key(s) {} of {} because of {}; unpickling runs any code the file '
                  'names, so only do this for snapshots you trust (this warning is shown once per '
                  'process)'.format(rank, ', '.join(repr(k) for k in keys[:8]), path, how),
                  CheckpointWarning, stacklevel=6)


def directory_problem(path):
    """Return why other users could write snapshots into the directory ``path``, or None."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    problems = []
    if st.st_mode & stat.S_IWOTH and not st.st_mode & stat.S_ISVTX:
        problems.append('world-writable without the sticky bit')
    geteuid = getattr(os, 'geteuid', None)
    if geteuid is not None and st.st_uid != geteuid():
        problems.append('owned by uid {} while this process runs as uid {}'.format(
            st.st_uid, geteuid()))
    if not problems:
        return None
    return ('checkpoint directory {} (mode {:04o}, {}) is {}: other users can put snapshots there that '
            'this job resumes from; use a directory only you can write to (e.g. chmod o-w)'.format(
                path, stat.S_IMODE(st.st_mode), stat.filemode(st.st_mode), ' and '.join(problems)))
