"""How this process is ending, as seen from an ``atexit`` handler: its exit status and why.

Python hands an ``atexit`` handler neither the status nor the reason: an uncaught exception
leaves ``sys.last_value`` behind (the interpreter sets it as it prints the traceback), but
``SystemExit`` leaves nothing.  So :func:`install` wraps ``sys.exit`` to note the status it is
called with (and changes nothing else); ``raise SystemExit(n)`` without ``sys.exit`` reads as a
program that returned.
"""

import os
import sys
import threading

__all__ = ['install', 'leaving', 'exit_called', 'status_of', 'abort_for', 'forked']

_lock = threading.Lock()
#: ``abort``: what ends the job at exit after a non-zero ``sys.exit`` (the global except hook's).
#: ``pid``: the process that installed the wrapper (made a communicator or added the hook).
_state = {'original': None, 'code': None, 'called': False, 'abort': None, 'pid': None}


def status_of(code):
    """Return the exit status of ``sys.exit(code)``: 0 for None, the low byte of an int, else 1."""
    if code is None:
        return 0
    if isinstance(code, bool) or not isinstance(code, int):
        return 1
    status = code & 0xFF
    return status if status or not code else 1


def _exit(status=None):
    """``sys.exit`` that notes its status first (see :func:`leaving`)."""
    if threading.current_thread() is threading.main_thread():
        _state['code'] = status
        _state['called'] = True
    return _state['original'](status)


def install(abort=None):
    """Wrap ``sys.exit`` once, so that :func:`leaving` knows the status of a ``sys.exit(n)``.

    ``abort(status)``: ends the job at exit after a ``sys.exit`` with that status and returns
    True, or returns False (:func:`chainermn_comm.global_except_hook.abort_on_exit_status`).
    """
    with _lock:
        if _state['pid'] is None:
            _state['pid'] = os.getpid()
        if abort is not None:
            _state['abort'] = abort
        if _state['original'] is None and sys.exit is not _exit:
            _state['original'] = sys.exit
            sys.exit = _exit


def forked():
    """Return whether this process is a ``fork()``ed child of the one that installed (its exit is not the rank's)."""
    pid = _state['pid']
    return pid is not None and pid != os.getpid()


def abort_for(status):
    """At exit after ``sys.exit(status)``: end the job the installed way and return True, else False."""
    abort = _state['abort']
    return bool(abort is not None and abort(status))


def exit_called():
    """Return the status the main thread's last ``sys.exit`` was called with, or None (none was)."""
    return status_of(_state['code']) if _state['called'] else None


def leaving():
    """Return (status or None when unknown, why) of this process's end; call it at exit.

    ``why`` reads after a rank and host: 'exited with status 3', 'exited with status 1 (uncaught
    ValueError: ...)', 'ended (its program returned)'.
    """
    exc = getattr(sys, 'last_value', None)
    if exc is not None and not isinstance(exc, SystemExit):
        text = str(exc).strip().splitlines()
        text = text[0] if text else ''
        if len(text) > 120:
            text = text[:117] + '...'
        what = type(exc).__name__ + (': ' + text if text else '')
        status = 130 if isinstance(exc, KeyboardInterrupt) else 1  # Python ends by SIGINT then
        return status, 'exited with status {} (uncaught {})'.format(status, what)
    if _state['called']:
        status = status_of(_state['code'])
        return status, 'exited with status {}'.format(status)
    return None, 'ended (its program returned)'
