"""A temporary directory that every rank of a test job shares, removed when the job's rank 0 exits."""

import atexit
import shutil
import tempfile

__all__ = ['shared_tmpdir']


def shared_tmpdir(comm, prefix):
    """Make a temporary directory on rank 0 of ``comm``; return its path on every rank (collective).

    Rank 0 removes it when its process exits.
    """
    path = None
    if comm.rank == 0:
        path = tempfile.mkdtemp(prefix=prefix)
        atexit.register(shutil.rmtree, path, True)
    return comm.bcast_obj(path)
