"""Debug mode at program exit: meet the other ranks' pending collectives with a '<program exit>' call.

A rank that finishes while another still waits in a collective would leave it blocked; in debug
mode each guard over the whole job joins one last agreement check at exit, so the waiting rank
raises "ranks disagree ... exiting" instead.
"""

import atexit
import threading
import weakref

from chainermn_comm._errors import CommunicationError
from chainermn_comm.guard import exit_status
from chainermn_comm.guard.report import EXIT_CALL
from chainermn_comm.log import get_logger

__all__ = ['register']

#: Debug-mode guards on the whole job, in creation order; checked once more at program exit.
_guards = []
_lock = threading.Lock()
_installed = [False]


def register(guard):
    """Check ``guard`` once more at program exit (before MPI_Finalize)."""
    exit_status.note_process()  # a fork()ed child's exit does not check (no sys.exit wrapper)
    with _lock:
        _guards.append(weakref.ref(guard))
        if not _installed[0]:
            # Registered after mpi4py's own MPI_Finalize hook, so it runs before it (LIFO).
            atexit.register(_check_at_exit)
            _installed[0] = True


def _check_at_exit():
    if exit_status.forked():
        return
    try:
        from mpi4py import MPI
        if not MPI.Is_initialized() or MPI.Is_finalized():
            return
    except Exception:
        return
    for ref in list(_guards):
        guard = ref()
        if guard is None or guard.agreement.debug_comm is None or guard.agreement.desynced:
            continue
        try:
            with guard(EXIT_CALL, ()):
                pass
        except CommunicationError as e:
            get_logger('guard').error('%s', e)
            break
        except Exception:
            break
