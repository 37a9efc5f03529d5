"""What the checkpointer may trust: pickle only when the user opts in, and a directory only they write.

Also the checkpointer's warning and error classes, so that every checkpoint module raises the same,
and :func:`agree`, which makes every rank raise the same error together.  Directories and files
are checked by ``chainermn_comm.safe_files`` (``CHAINERMN_TRUST_SHARED=1`` or ``allow_shared=True``
opts in to shared ones).
"""

import warnings

from chainermn_comm import protocol, settings, voice
from chainermn_comm.safe_files import UntrustedPathError

__all__ = ['CheckpointWarning', 'SnapshotUnusableError', 'UnsafeCheckpointError',
           'CheckpointInUseError', 'ALLOW_PICKLE_ENV', 'START_FRESH_ENV', 'OPT_IN_HINT',
           'allow_pickle', 'start_fresh', 'warn_pickle_once', 'agree']

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
    """Warned when a snapshot cannot be used, when pickle is used, or a dead job's claim is taken over."""


class SnapshotUnusableError(RuntimeError):
    """Raised by ``maybe_load`` when snapshots exist but none can be used (nothing is deleted)."""


class UnsafeCheckpointError(SnapshotUnusableError):
    """Raised by ``maybe_load`` when no snapshot can be loaded and some were refused for pickle."""


class CheckpointInUseError(RuntimeError):
    """Raised on every rank when another live job writes the same snapshots into the same directory."""


#: The error classes :func:`agree` raises again on every rank (others become RuntimeError).
_ERRORS = {c.__name__: c for c in (UntrustedPathError, CheckpointInUseError, SnapshotUnusableError,
                                   UnsafeCheckpointError, NotADirectoryError, FileNotFoundError,
                                   PermissionError, OSError, ValueError, TypeError, RuntimeError)}


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


def agree(comm, problem):
    """Raise the same error on every rank when any rank has a ``problem`` (an exception); collective.

    The error is the first failing rank's, of its class, naming that rank (and the others that
    failed too), so a job of N ranks stops with one clear message instead of hanging.
    """
    mine = None if problem is None else (type(problem).__name__, str(problem))
    views = comm.allgather_obj(mine)
    bad = [(r, v) for r, v in enumerate(views) if v is not None]
    if not bad:
        return
    first, (name, text) = bad[0]
    cls = _ERRORS.get(name, RuntimeError)
    others = ''
    if len(bad) > 1:
        others = ' (rank(s) {} failed likewise)'.format(','.join(str(r) for r, _ in bad[1:]))
    message = 'rank {}: {}{}'.format(first, text, others)
    error = voice.agreed(cls(message), comm)   # the same on every rank: rank 0 reports it
    if problem is not None and first == comm.rank:
        raise error from problem
    raise error
