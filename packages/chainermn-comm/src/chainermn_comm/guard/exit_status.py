"""How this process is ending, as seen from an ``atexit`` handler: its exit status and why.

Python hands an ``atexit`` handler neither the status nor the reason: an uncaught exception
leaves ``sys.last_value`` behind (the interpreter sets it as it prints the traceback), but
``SystemExit`` leaves nothing.  So :func:`install` wraps ``sys.exit`` and the builtin ``exit`` and
``quit`` to note the status they are called with (and changes nothing else), and keeps the main
module's frame: a ``raise SystemExit(n)`` (``n`` a constant or none) that ended it is read from the
statement it stopped at.  On Python 3.12+ a ``SystemExit`` raised anywhere else (inside a function,
any status) is seen as it leaves the main module (``sys.monitoring``'s ``PY_UNWIND`` event, one
callback per frame an exception unwinds, nothing on the normal path).  Python 3.11 has no such
event: there a ``SystemExit`` raised directly inside a function reads as an exit whose status is
unknown (``sys.exit(n)`` keeps it).
"""

import builtins
import dis

import os
import sys
import threading

__all__ = ['UNKNOWN_EXIT', 'install', 'leaving', 'exit_called', 'status_of', 'abort_for', 'forked', 'note_process', 'interrupted']

_lock = threading.Lock()
#: Why a rank left, when a SystemExit ended it whose status Python 3.11 cannot read (``leaving``).
UNKNOWN_EXIT = 'exited (by a SystemExit whose status Python 3.11 cannot tell: sys.exit(n) keeps it)'
#: ``abort``: what ends the job at exit after a non-zero ``sys.exit`` (the global except hook's).
#: ``pid``: the process that installed the wrapper (made a communicator or added the hook).
#: ``raised``: ``(code,)`` of the SystemExit that left the main module (Python 3.12+), else None.
_state = {'original': None, 'code': None, 'called': False, 'abort': None, 'pid': None,
          'main': None, 'raised': None}
#: sys.monitoring tool ids tried for the PY_UNWIND watch (0-2 and 5 are the debugger's, coverage's,
#: profiler's and optimizer's).
_TOOL_IDS = (3, 4)


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


def _stopped_at():
    """Return the main module's instructions and the index of the one it stopped at, or (None, None).

    The index is None when ``f_lasti`` points into a call's inline cache (no instruction of its own).
    """
    frame = _state['main']
    if frame is None:
        return None, None
    try:
        code = list(dis.get_instructions(frame.f_code))
    except Exception:
        return None, None
    at = [i for i, ins in enumerate(code) if ins.offset == frame.f_lasti]
    return code, (at[0] if at else None)


def _raised_at_main():
    """Return ``(True, code)`` when the main module stopped at ``raise SystemExit(code)``, else (False, None)."""
    code, at = _stopped_at()
    if at is None or code[at].opname != 'RAISE_VARARGS' or code[at].arg != 1:
        return False, None
    before = [ins for ins in code[:at] if ins.opname not in ('CACHE', 'PRECALL', 'PUSH_NULL')]
    if before and before[-1].opname in ('LOAD_NAME', 'LOAD_GLOBAL') and before[-1].argval == 'SystemExit':
        return True, None  # raise SystemExit
    if len(before) >= 3 and before[-1].opname in ('CALL', 'CALL_FUNCTION') and \
            before[-1].arg == 1 and before[-2].opname in ('LOAD_CONST', 'LOAD_SMALL_INT') and \
            before[-3].opname in ('LOAD_NAME', 'LOAD_GLOBAL') and before[-3].argval == 'SystemExit':
        return True, before[-2].argval  # raise SystemExit(<constant>)
    return False, None


def _watch_unwind(main):
    """On Python 3.12+, note the code of a SystemExit that unwinds the main module's frame ``main``."""
    monitoring = getattr(sys, 'monitoring', None)
    if monitoring is None or main is None:
        return
    code = main.f_code
    for tool in _TOOL_IDS:
        try:
            monitoring.use_tool_id(tool, 'chainermn exit status')
        except ValueError:   # taken by another tool
            continue
        break
    else:
        return

    def unwound(unwound_code, offset, exc):
        if unwound_code is code and isinstance(exc, SystemExit):
            _state['raised'] = (exc.code,)

    monitoring.register_callback(tool, monitoring.events.PY_UNWIND, unwound)
    monitoring.set_events(tool, monitoring.get_events(tool) | monitoring.events.PY_UNWIND)


def _ended_mid_statement():
    """Return whether the main module stopped before its end (a call it made raised), on Python < 3.12."""
    if getattr(sys, 'monitoring', None) is not None:
        return False
    code, at = _stopped_at()
    return code is not None and (at is None or code[at].opname not in ('RETURN_VALUE', 'RETURN_CONST'))


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
            _watch_unwind(_state['main'])


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
    if _state['raised'] is not None:   # what left the main module is what ends the program
        return status_of(_state['raised'][0])
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
    ValueError: ...)', 'ended (its program returned)', and on Python 3.11 'exited (a SystemExit raised
    inside a function; ...)' (status None).
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
    if _ended_mid_statement():
        return None, UNKNOWN_EXIT
    return None, 'ended (its program returned)'
