"""Abort the whole MPI job when one rank dies of an uncaught Python exception or a non-zero exit.

Use ``chainermn.global_except_hook.add_hook()``, or set
``CHAINERMN_FORCE_ABORT_ON_EXCEPTION=1`` (checked when chainermn is imported), or run
``python -m mpi4py script.py``.  With the hook, ``sys.exit(n)`` with a non-zero ``n`` on one
rank also aborts the job (``SystemExit`` never reaches ``sys.excepthook``, so the hook notes the
status that ``sys.exit`` is called with and aborts at exit), and the job's exit status is ``n``.

An error that every rank raised together (:mod:`chainermn_comm.voice`) is reported once: the
rank that reports it prints it, says that it aborts and ends the job; every other rank prints one
line pointing at it and waits (at most :data:`AGREED_WAIT` seconds) for that rank to end the job,
so that no rank cuts the report short; when that rank stays silent (it caught the error) the
waiting rank prints the whole report itself before it ends the job.  An error of one rank is printed by that rank, once.
"""

import atexit
import os
import sys
import threading
import time

from chainermn_comm import settings, voice
from chainermn_comm.guard import exit_status
from chainermn_comm.log import get_logger
from chainermn_comm.protocol import FORCE_ABORT_ENV

__all__ = ['add_hook', 'remove_hook', 'abort_on_exit_status', 'FORCE_ABORT_ENV', 'EXIT_STATUS']

#: Status passed to MPI_Abort after an uncaught exception.
EXIT_STATUS = 1

#: Seconds to wait after printing, before MPI_Abort: MPICH's launcher drops output it has not
#: forwarded yet when the job is aborted, which would lose the traceback and the rank.
FLUSH_GRACE_S = 0.5
#: Seconds a rank whose error every rank raised together waits for the reporting rank to end the
#: job (it prints the report first) before it ends the job itself.
AGREED_WAIT = 10.0

_state = {'sys': None, 'threading': None, 'atexit': False}
_log = get_logger('global_except_hook')


def _rank():
    try:
        from mpi4py import MPI
        if MPI.Is_initialized() and not MPI.Is_finalized():
            return MPI.COMM_WORLD.Get_rank()
    except Exception:
        pass
    return os.environ.get('PMI_RANK', os.environ.get('OMPI_COMM_WORLD_RANK', '?'))


def _abort(exc_type, exc_value, exc_tb, previous):
    status = EXIT_STATUS
    try:
        how = voice.report_uncaught(exc_type, exc_value, exc_tb, previous)
        rank = _rank()
        if how == 'interrupt':  # Ctrl-C: one report (rank 0's), the job ends with 130
            status = voice.INTERRUPT_STATUS
            voice.end_interrupted(exc_tb)
        reporter = voice.reporter_of(exc_value)
        sys.stderr.flush()
        sys.stdout.flush()
        started = time.monotonic()
        _flush_trace()
        if reporter is not None and str(reporter) != str(rank):
            # Every rank raised it: the reporting rank prints it and ends the job; ending it from
            # here first could cut its report short.
            time.sleep(max(0.0, AGREED_WAIT - (time.monotonic() - started)))
            # It is silent (it caught the error, or hangs): this rank prints the report instead.
            voice.report_caught_elsewhere(exc_type, exc_value, exc_tb)
            _log.critical('rank %s did not end the job within %g s after the %s every rank raised; '
                          'calling MPI_Abort(%d) from rank %s.', reporter, AGREED_WAIT,
                          exc_type.__name__, EXIT_STATUS, rank)
            sys.stderr.flush()
        else:
            _log.critical('uncaught %s on rank %s; calling MPI_Abort(%d) to stop all ranks.',
                          exc_type.__name__, rank, EXIT_STATUS)
            sys.stderr.flush()
            time.sleep(max(0.0, FLUSH_GRACE_S - (time.monotonic() - started)))
    finally:
        try:
            from mpi4py import MPI
            if MPI.Is_initialized() and not MPI.Is_finalized():
                MPI.COMM_WORLD.Abort(status)
        except Exception:
            _log.critical('MPI_Abort failed; this MPI process may hang.')
            sys.stderr.flush()
        os._exit(status)


def _flush_trace():
    """Write this rank's trace (CHAINERMN_TRACE) and merge the parts there are, before the abort."""
    try:
        from chainermn_comm import trace
        if trace.ON:
            trace.flush('exception')
    except Exception:
        pass


def _sys_hook(exc_type, exc_value, exc_tb):
    if exit_status.forked() or \
            (issubclass(exc_type, KeyboardInterrupt) and exc_type is not KeyboardInterrupt):
        # A fork()ed child's error is its own: printed as Python prints it, the job goes on.
        return _state['sys'](exc_type, exc_value, exc_tb)
    _abort(exc_type, exc_value, exc_tb, _state['sys'])


_sys_hook.chainermn_reports = True  # voice.install() leaves this hook in place


def _thread_hook(args):
    if args.exc_type is SystemExit:
        return
    if exit_status.forked():
        return _state['threading'](args)
    _abort(args.exc_type, args.exc_value, args.exc_traceback,
           lambda t, v, tb: _state['threading'](args))


def add_hook():
    """Install the hook: an uncaught exception in any thread, or ``sys.exit(n)`` with ``n`` != 0
    in the main thread, prints and aborts the MPI job."""
    if _state['sys'] is not None:
        return
    _state['sys'] = sys.excepthook
    _state['threading'] = threading.excepthook
    sys.excepthook = _sys_hook
    threading.excepthook = _thread_hook
    exit_status.install(abort=abort_on_exit_status)
    if not _state['atexit']:
        _state['atexit'] = True
        atexit.register(_at_exit)


def abort_on_exit_status(status):
    """With the hook installed, abort the job with ``status`` (non-zero) and return True; else False.

    Called at program exit after ``sys.exit(status)``.
    """
    if _state['sys'] is None or not status or exit_status.forked():
        return False
    try:
        from mpi4py import MPI
        if not MPI.Is_initialized() or MPI.Is_finalized():
            return False
    except Exception:
        return False
    try:
        _log.critical('sys.exit(%d) on rank %s; calling MPI_Abort(%d) to stop all ranks.', status,
                      _rank(), status)
        sys.stderr.flush()
        sys.stdout.flush()
        started = time.monotonic()
        _flush_trace()
        time.sleep(max(0.0, FLUSH_GRACE_S - (time.monotonic() - started)))
    finally:
        try:
            MPI.COMM_WORLD.Abort(status)
        finally:
            os._exit(status)


def _at_exit():
    """Abort the job when the program ends with a non-zero status that ``sys.exit`` was given."""
    try:
        status = exit_status.exit_called()
        if status:  # an uncaught exception was aborted by the hook already
            abort_on_exit_status(status)
    except Exception:
        pass


def remove_hook():
    """Restore the exception hooks that were in place before add_hook()."""
    if _state['sys'] is None:
        return
    sys.excepthook = _state['sys']
    threading.excepthook = _state['threading']
    _state['sys'] = _state['threading'] = None


def _add_hook_if_enabled():
    """Install the hook when $CHAINERMN_FORCE_ABORT_ON_EXCEPTION is set to a true value."""
    try:
        enabled = settings.read(FORCE_ABORT_ENV)
    except ValueError:  # not understood: create_communicator's environment check raises it
        return
    if enabled:
        add_hook()
