"""The launch status file: how a job (the checkpointer, on rank 0) tells ``python -m chainermn launch``
what it loaded and how far it got.

A small JSON object, replaced atomically through :mod:`chainermn_comm.safe_files` and read back only
when it is this user's own regular file; its path is ``$CHAINERMN_LAUNCH_PROGRESS``
(:data:`chainermn_comm.protocol.LAUNCH_STATUS_ENV`), set by the launcher.  Also :func:`launch_attempt`,
which names this start of a job that a launcher restarts.
"""

import json
import os

from chainermn_comm import safe_files, settings
from chainermn_comm.protocol import LAUNCH_RESTARTS_ENV, LAUNCH_STATUS_ENV

__all__ = ['LaunchStatusWriter', 'read_launch_status', 'launch_attempt']


class LaunchStatusWriter:
    """Keep the launch status file up to date: a JSON object, replaced atomically on each update.

    Fields written by the checkpointer on rank 0: ``generation`` (the generation it loaded, or
    None), ``first_iteration_wall`` (unix time at the end of the first iteration) and
    ``iteration`` (the last finished iteration).
    """

    def __init__(self, path):
        self.path = path
        self.fields = {}

    def update(self, **fields):
        """Merge ``fields`` into the status and write it (a reader never sees a partial file)."""
        self.fields.update(fields)
        safe_files.write_text(self.path, json.dumps(self.fields))


def launch_attempt(environ=None):
    """Return ``(launch, attempt)`` naming this start of a job that a launcher restarts, or None.

    ``python -m chainermn launch`` (its status file names the launch, ``CHAINERMN_LAUNCH_RESTARTS``
    counts the restarts) or a Slurm job (``SLURM_JOB_ID``, ``SLURM_RESTART_COUNT`` after a
    requeue).  A launcher starts an attempt only once the one before has ended, so the processes
    of an earlier attempt of the same launch are gone, whatever host they ran on.
    """
    env = os.environ if environ is None else environ
    status = settings.read(LAUNCH_STATUS_ENV, environ=env)
    if status:
        return 'launch:' + status, int(settings.read(LAUNCH_RESTARTS_ENV, environ=env))
    job = env.get('SLURM_JOB_ID', '').strip()
    if job:
        restarts = env.get('SLURM_RESTART_COUNT', '0').strip()
        return ('slurm:{}:{}'.format(env.get('SLURM_CLUSTER_NAME', ''), job),
                int(restarts) if restarts.isdigit() else 0)
    return None


def read_launch_status(path):
    """Return the launch status as a dict; {} when the file is missing, unreadable or not trusted.

    Only a regular file of this user that nobody else can write is read (never through a link).
    """
    try:
        with safe_files.open_trusted(path, 'launch status file') as f:
            value = json.loads(f.read().decode('utf-8'))
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}
