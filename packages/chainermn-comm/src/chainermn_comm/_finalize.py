"""What a communicator becomes after ``finalize()``: every later call raises a clear error."""

from chainermn_comm._errors import CommunicationError

__all__ = ['CommunicatorFinalizedError', 'FinalizedGuard', 'HookGuard', 'close_guard', 'free_comm']


class CommunicatorFinalizedError(CommunicationError):
    """Raised by a communicator method called after ``finalize()``."""


class FinalizedGuard:
    """Stand-in for a communicator's call guard: entering any call raises CommunicatorFinalizedError."""

    def __init__(self, communicator):
        self._what = '{} communicator (rank {} of {})'.format(
            getattr(communicator, 'name', type(communicator).__name__), communicator.rank,
            communicator.size)
        self.timeout = 0.0

    def __call__(self, name, *args, **kwargs):
        raise CommunicatorFinalizedError(
            '{}: {}() was called after finalize() released this communicator; create a new one '
            'with chainermn.create_communicator() and call finalize() only when no more '
            'communication follows'.format(self._what, name))


class HookGuard:
    """Stand-in for a communicator's call guard while a communication hook runs: calls raise.

    A hook already runs inside the communicator's checked call of the average; a collective of
    the communicator started from it would nest one checked call in another (and, on a rank
    whose hook does it alone, wait for ranks that never join).  Everything else is the guard's.
    """

    def __init__(self, guard, hook, rank):
        self._guard = guard
        self._hook = hook
        self._rank = rank

    def __call__(self, name, *args, **kwargs):
        raise CommunicationError(
            'rank {}: the communication hook {!r} called the communicator\'s {}(); a hook runs '
            'inside the average\'s own checked call and may average only with '
            'chainermn.hooks.mean(comm, arrays) (or use comm.mpi_comm directly, the same on every '
            'rank); move other collectives out of the hook'.format(self._rank, self._hook, name))

    def __getattr__(self, name):
        return getattr(self._guard, name)


def close_guard(guard):
    """Free what a call guard holds (collective): the stall inspector's side channel, the debug copy."""
    close = getattr(guard, 'close', None)
    if close is not None:
        close()
    agreement = getattr(guard, 'agreement', None)
    debug_comm = getattr(agreement, 'debug_comm', None)
    if debug_comm is not None:
        agreement.debug_comm = None  # the check at program exit skips guards without one
        free_comm(debug_comm)


def free_comm(comm):
    """Free an MPI communicator this library created (collective); ignore null handles."""
    from mpi4py import MPI
    if comm is not None and comm != MPI.COMM_NULL:
        comm.Free()
