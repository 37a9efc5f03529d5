"""Resolve the MPI communicator behind a ChainerMN or mpi4py communicator; guard blocking calls."""

from chainermn_comm.engine import guarded_call

__all__ = ['mpi_comm_of', 'guarded', 'describe', 'LOAD_ON_ROOT']

#: The fix for a data set that is None on ranks other than the one that loaded it.
LOAD_ON_ROOT = ('Load the data set on rank 0 only and give every rank its own shard with '
                'train = chainermn.scatter_dataset(train, comm) (every rank calls it; the others pass '
                'None), then make each rank\'s iterator over its shard')


def mpi_comm_of(comm):
    """Return the mpi4py intracommunicator behind ``comm`` (a ChainerMN communicator or mpi4py's)."""
    from mpi4py import MPI
    raw = getattr(comm, 'mpi_comm', comm)
    if not isinstance(raw, MPI.Intracomm):
        raise TypeError('comm must be a ChainerMN communicator (e.g. chainermn.create_communicator()) '
                        'or an mpi4py intracommunicator (e.g. MPI.COMM_WORLD); got {}'.format(
                            type(comm).__name__))
    return raw


def guarded(comm, name, sig=()):
    """Return the ChainerMN watchdog guard for a blocking call, or a no-op for raw mpi4py comms."""
    # key=(): the agreement check compares only the call name; the data functions exchange and
    # compare their arguments themselves, with messages that say more.
    return guarded_call(comm, name, sig, key=())


def describe(obj):
    """Return a short description of ``obj``'s type for error messages."""
    t = type(obj)
    mod = t.__module__
    name = t.__qualname__ if mod in ('builtins', None) else '{}.{}'.format(mod, t.__qualname__)
    shape = getattr(obj, 'shape', None)
    dtype = getattr(obj, 'dtype', None)
    if shape is not None and dtype is not None:
        return '{} (shape {}, dtype {})'.format(name, tuple(shape), dtype)
    return name
