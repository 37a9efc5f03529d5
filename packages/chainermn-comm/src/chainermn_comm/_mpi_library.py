"""Import ``mpi4py.MPI``; when mpi4py cannot load an MPI library, say exactly how to get one."""

from chainermn_comm.install_hints import MPI_INSTALL_HINT

__all__ = ['MPI', 'MPILibraryError']


class MPILibraryError(RuntimeError):
    """mpi4py is installed but no MPI library (libmpi) could be loaded."""


def _load():
    try:
        from mpi4py import MPI
    except (RuntimeError, ImportError, OSError) as e:
        # mpi4py 4 raises RuntimeError('cannot load MPI library\n<one line per libmpi tried>').
        if 'MPI library' not in str(e) and 'libmpi' not in str(e):
            raise
        tried = str(e).splitlines()
        raise MPILibraryError('mpi4py cannot load an MPI library ({}; {} tried). To fix: {}.'.format(
            tried[0], max(len(tried) - 1, 0), MPI_INSTALL_HINT)) from e
    return MPI


MPI = _load()
