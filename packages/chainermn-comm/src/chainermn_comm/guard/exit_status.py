"""How this process is ending, as seen from an ``atexit`` handler: its exit status and why.

Python hands an ``atexit`` handler neither the status nor the reason: an uncaught exception
leaves ``sys.last_value`` behind (the interpreter sets it as it prints the traceback), but
``SystemExit`` leaves nothing.  So :func:`install` wraps ``sys.exit`` and the builtin ``exit`` and
``quit`` to note the status they are called with (and changes nothing else), and keeps the main
module's frame: a ``raise SystemExit(n)`` (``n`` a constant or none) that ended it is read from the
statement it stopped at.  A ``SystemExit`` raised directly elsewhere (inside a function) with a
status that is not a constant in that statement reads as a program that returned.
"""

import builtins
import dis

import os
import sys
import threading

__all__ = ['install', 'leaving', 'exit_called', 'status_of', 'abort_for', 'forked', 'note_process', 'interrupted']

_lock = threading.Lock()
#: ``abort``: what ends the job at exit after a non-zero ``sys.exit`` (the global except hook's).
#: ``pid``: the process that installed the wrapper (made a communicator or added the hook).
_state = {'original': None, 'code': None, 'called': False, 'abort': None, 'pid': None,
          'main': None}


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


class _Quitter:
    """The builtin ``exit``/``quit`` (site's), noting its status first like :func:`_exit`."""

    def __init__(self, original):
        self._original = original

    def __repr__(self):
        return repr(self._original)

    def __call__(self, code=None):
        if threading.current_thread() is threading.main_thread():
            _state['code'] = code
            _state['called'] = True
        return self._original(code)


def _main_frame():
    """Return the frame running the ``__main__`` module's own code, or None."""
    main = getattr(sys.modules.get('__main__'), '__dict__', None)
    frame, found = sys._getframe(), None
    while frame is not None:
        if frame.f_globals is main and frame.f_code.co_name == '<module>':
            found = frame
        frame = frame.f_back
    return found


def _raised_at_main():
    """Return ``(True, code)`` when the main module stopped at ``raise SystemExit(code)``, else (False, None)."""
    frame = _state['main']
    if frame is None:
        return False, None
    try:
        code = list(dis.get_instructions(frame.f_code))
        at = [i for i, ins in enumerate(code) if ins.offset == frame.f_lasti]
        if not at or code[at[0]].opname != 'RAISE_VARARGS' or code[at[0]].arg != 1:
            return False, None
        before = [ins for ins in code[:at[0]] if ins.opname not in ('CACHE', 'PRECALL', 'PUSH_NULL')]
        if before and before[-1].opname in ('LOAD_NAME', 'LOAD_GLOBAL') and \
                before[-1].argval == 'SystemExit':
            return True, None  # raise SystemExit
        if len(before) >= 3 and before[-1].opname in ('CALL', 'CALL_FUNCTION') and \
                before[-1].arg == 1 and before[-2].opname in ('LOAD_CONST', 'LOAD_SMALL_INT') and \
                before[-3].opname in ('LOAD_NAME', 'LOAD_GLOBAL') and before[-3].argval == 'SystemExit':
            return True, before[-2].argval  # raise SystemExit(<constant>)
    except Exception:
        pass
    return False, None


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
            for name in ('exit', 'quit'):
                original = getattr(builtins, name, None)
                if original is not None and not isinstance(original, _Quitter):
                    setattr(builtins, name, _Quitter(original))
            _state['main'] = _main_frame()


def note_process():
    """Note this process as the one that made the communicators (no wrapper: :func:`forked` then works)."""
    with _lock:
        if _state['pid'] is None:
            _state['pid'] = os.getpid()


def forked():
    """Return whether this process is a ``fork()``ed child of the one that installed (its exit is not the rank's)."""
    pid = _state['pid']
    return pid is not None and pid != os.getpid()


def abort_for(status):
    """At exit after ``sys.exit(status)``: end the job the installed way and return True, else False."""
    abort = _state['abort']
    return bool(abort is not None and abort(status))


def exit_called():
    """Return the status the main thread's last ``sys.exit`` (or builtin ``exit``) was called with,
    or that the main module's ``raise SystemExit(n)`` gives, or None (neither happened)."""
    if _state['called']:
        return status_of(_state['code'])
    raised, code = _raised_at_main()
    return status_of(code) if raised else None


def interrupted():
    """Return whether this process is ending of an uncaught KeyboardInterrupt (Ctrl-C)."""
    return isinstance(getattr(sys, 'last_value', None), KeyboardInterrupt)


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
    status = exit_called()
    if status is not None:
        return status, 'exited with status {}'.format(status)
    return None, 'ended (its program returned)'
