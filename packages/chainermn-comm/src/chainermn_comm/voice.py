"""One voice for a job of N ranks: a warning every rank gives is shown once, an error every rank
raises together is reported once.

Warnings.  :func:`warn_all` is called on every rank with the same warning: the warnings filters act
on every rank alike (``'error'`` raises on every rank at the same point, ``'ignore'`` silences it
everywhere), and only rank 0 shows it.  :func:`together` runs a check on every rank of a
communicator (``create_communicator``'s settings and name): the warnings it gives are gathered and
rank 0 shows each one once, naming the ranks when not every rank gave it; an error on any rank
is raised on every rank.

Errors.  :func:`agreed` marks an exception that every rank of a communicator raises at the same
point after an exchange told every rank the same thing (ranks that disagree, one rank's invalid
input, different batch sizes, settings).  When it is not caught, the communicator's rank 0
prints the report (traceback and message, with the per-rank table where the message has one)
and every other rank prints one line that points at it (:func:`report_uncaught`: from the first
communicator on through ``sys.excepthook`` (:func:`install`), and through
:mod:`chainermn_comm.global_except_hook`).  An error of one rank is printed as Python prints it,
once: an exception whose report a Chainer ``Trainer`` already printed (``chainermn_train`` marks
it with :func:`mark_shown`) is not printed again.  When the reporting rank catches such an error
and goes on while the others end with it, the report is not lost: that rank prints it when their
exit notices come (:func:`report_caught`), and under the global except hook the other ranks print
it themselves when the reporting rank has not ended the job in time (:func:`report_caught_elsewhere`).

Names.  Every message names a rank by its ``MPI.COMM_WORLD`` rank, with its own rank beside it on a
sub-communicator (:func:`who`, :func:`label`).  Ctrl-C.  An uncaught ``KeyboardInterrupt`` is one
line from world rank 0 (:func:`interrupted_line`, :func:`on_interrupt`), then the job ends with
``MPI_Abort(INTERRUPT_STATUS)`` (:func:`end_interrupted`).
"""

import builtins
import sys
import types
import traceback
import warnings

from chainermn_comm.log import get_logger, rank_and_host

__all__ = ['world_ranks', 'world', 'label', 'who', 'SUB_COMMUNICATOR', 'AGREED_ATTR', 'SHOWN_ATTR', 'warn_all', 'together', 'agreed', 'reporter_of', 'mark_shown',
           'shown', 'decide', 'pointer_line', 'report_uncaught', 'report_caught',
           'report_caught_elsewhere', 'early_report',
           'install', 'world_rank', 'on_interrupt', 'interrupted_line', 'report_interrupt_here',
           'end_interrupted', 'INTERRUPT_STATUS', 'INTERRUPT_WAIT']

#: Attribute of an exception raised together: the ``MPI.COMM_WORLD`` rank that reports it.
AGREED_ATTR = 'chainermn_agreed'
#: Attribute of an exception whose report was printed already (by the Trainer's early report).
SHOWN_ATTR = 'chainermn_shown'

_log = get_logger('error')
_hook = {'previous': None}
#: The exit status of a job ended by Ctrl-C (SIGINT), as a shell gives it.
INTERRUPT_STATUS = 130
#: Functions ``note(trainer or None)`` -> a phrase for the interrupt report, or None (:func:`on_interrupt`).
_interrupt_notes = []
_interrupt_state = {'reported': False}
#: Seconds a rank other than 0 waits, after Ctrl-C, for rank 0 to report it and end the job.
INTERRUPT_WAIT = 3.0
#: Seconds between a report and MPI_Abort (the launcher forwards the output meanwhile).
_FLUSH_GRACE = 0.5


def world_rank():
    """Return this process's rank in ``MPI.COMM_WORLD`` (or the launcher's rank variable), as an int or None."""
    rank = rank_and_host()[0]
    try:
        return int(rank)
    except (TypeError, ValueError):
        return None


# -- naming ranks: one numbering, the whole job's ----------------------------------------------
def world_ranks(mpi_comm):
    """Return the ``MPI.COMM_WORLD`` rank of each rank of ``mpi_comm`` (None for one outside it), or
    None when ``mpi_comm`` numbers its ranks as the whole job does (messages then say 'rank R')."""
    try:
        from mpi4py import MPI
        mine, everyone = mpi_comm.Get_group(), MPI.COMM_WORLD.Get_group()
    except Exception:
        return None
    try:
        ranks = MPI.Group.Translate_ranks(mine, list(range(mine.Get_size())), everyone)
        same = mine.Get_size() == everyone.Get_size()
    finally:
        mine.Free()
        everyone.Free()
    ranks = [None if r == MPI.UNDEFINED else int(r) for r in ranks]
    return None if same and ranks == list(range(len(ranks))) else ranks


#: How a rank's own rank on a communicator other than the whole job's is named beside its world rank.
SUB_COMMUNICATOR = 'the split communicator'


def world(rank, world_of=None):
    """Return ``rank`` of a communicator as ``MPI.COMM_WORLD`` numbers it (``world_of``: the world
    rank of each of its ranks, None on the whole job's communicator)."""
    if world_of is None or not 0 <= rank < len(world_of) or world_of[rank] is None:
        return rank
    return world_of[rank]


def label(rank, world_of=None):
    """Return 'rank W', or on a sub-communicator 'rank W (rank R of the split communicator)'."""
    if world_of is None:
        return 'rank {}'.format(rank)
    return 'rank {} (rank {} of {})'.format(world(rank, world_of), rank, SUB_COMMUNICATOR)


def who(rank, host, world_of=None):
    """Return 'rank W (host H)', or on a sub-communicator 'rank W (rank R of the split communicator, host H)'."""
    if world_of is None:
        return 'rank {} (host {})'.format(rank, host)
    return 'rank {} (rank {} of {}, host {})'.format(world(rank, world_of), rank, SUB_COMMUNICATOR, host)


# -- warnings ---------------------------------------------------------------------------------
def warn_all(message, category=UserWarning, rank=0, stacklevel=1):
    """Warn on every rank (the filters act alike everywhere); show it on ``rank`` 0 only.

    Call it on every rank with the same warning.  On the other ranks the warning goes through
    the filters (so ``'error'`` raises there too) and is then dropped instead of shown.
    """
    if rank == 0:
        warnings.warn(message, category, stacklevel=stacklevel + 1)
        return
    with warnings.catch_warnings(record=True):   # filters unchanged: only the display is dropped
        warnings.warn(message, category, stacklevel=stacklevel + 1)


def _category_key(category):
    return getattr(category, '__module__', ''), getattr(category, '__qualname__', str(category))


def _category_of(key):
    module, name = key
    cls = getattr(sys.modules.get(module), name, None) if '.' not in name else None
    return cls if isinstance(cls, type) and issubclass(cls, Warning) else UserWarning


def _show_once(mine, everyone):
    """On rank 0: show each warning of ``everyone`` once, naming the ranks when not all gave it."""
    size = len(everyone)
    own = {(_category_key(w.category), str(w.message)): w for w in mine}
    seen = {}
    for r, (ws, _) in enumerate(everyone):
        for key, text, filename, lineno in ws:
            seen.setdefault((key, text), [filename, lineno, []])[2].append(r)
    for (key, text), (filename, lineno, ranks) in seen.items():
        suffix = '' if len(ranks) == size else ' ({} {})'.format(
            'rank' if len(ranks) == 1 else 'ranks', ', '.join(str(r) for r in ranks))
        w = own.get((key, text))
        if w is not None:
            warnings.showwarning(text + suffix, w.category, w.filename, w.lineno, w.file, w.line)
        else:
            warnings.showwarning(text + suffix, _category_of(key), filename, lineno)


def _error_class(name, own):
    if own is not None and type(own).__name__ == name:
        return type(own)
    cls = getattr(builtins, name, None)
    if isinstance(cls, type) and issubclass(cls, Exception) and not issubclass(cls, Warning):
        return cls
    from chainermn_comm._errors import CommunicationError
    return CommunicationError


def together(mpi_comm, fn, what):
    """Run ``fn()`` on every rank of ``mpi_comm``; show its warnings once; raise its errors everywhere.

    Collective (one ``allgather`` of each rank's warnings and error).  Returns ``fn()``'s result.
    When every rank raised the same error, each raises its own, marked :func:`agreed`; otherwise
    every rank raises one error (the first failing rank's class when it is a built-in one, else
    ``CommunicationError``) naming each failing rank and what it raised.
    """
    error, result = None, None
    with warnings.catch_warnings(record=True) as caught:   # the user's filters still apply
        try:
            result = fn()
        except Exception as e:   # warnings turned into errors among them
            error = e
    mine = ([(_category_key(w.category), str(w.message), w.filename, w.lineno) for w in caught],
            None if error is None else (type(error).__name__, str(error)))
    everyone = mpi_comm.allgather(mine)
    rank = mpi_comm.Get_rank()
    if rank == 0:
        _show_once(caught, everyone)
    failed = [(r, e[1]) for r, e in enumerate(everyone) if e[1] is not None]
    if not failed:
        return result
    if len(failed) == len(everyone) and len({f for _, f in failed}) == 1:
        raise agreed(error, mpi_comm)
    world_of = world_ranks(mpi_comm)
    listed = '; '.join('{}: {}: {}'.format(label(r, world_of), name, text) for r, (name, text) in failed)
    names = {name for _, (name, _) in failed}
    text = '{}: {} failed on {} of {} rank(s), so it fails on every rank. {}'.format(
        label(rank, world_of), what, len(failed), len(everyone), listed)
    try:
        new = _error_class(failed[0][1][0] if len(names) == 1 else 'RuntimeError', error)(text)
    except Exception:   # a class that does not take one message
        from chainermn_comm._errors import CommunicationError
        new = CommunicationError(text)
    agreed(new, mpi_comm)
    if error is not None:
        raise new from error
    raise new from None


# -- errors -----------------------------------------------------------------------------------
def _world_rank_of_root(comm):
    """Return the ``MPI.COMM_WORLD`` rank of rank 0 of ``comm`` (a ChainerMN or mpi4py communicator)."""
    mpi = getattr(comm, 'mpi_comm', comm)
    if mpi is None:
        return 0
    try:
        from mpi4py import MPI
        mine, world = mpi.Get_group(), MPI.COMM_WORLD.Get_group()
        try:
            rank = MPI.Group.Translate_ranks(mine, [0], world)[0]
        finally:
            mine.Free()
            world.Free()
        return 0 if rank == MPI.UNDEFINED else int(rank)
    except Exception:
        return 0


def agreed(error, comm=None):
    """Mark ``error`` as raised by every rank of ``comm`` together (rank 0 reports it); return it."""
    try:
        setattr(error, AGREED_ATTR, _world_rank_of_root(comm))
    except AttributeError:   # an exception class with __slots__: reported on every rank
        pass
    return error


def reporter_of(exc):
    """Return the ``MPI.COMM_WORLD`` rank that reports ``exc`` when every rank raised it together, else None."""
    return getattr(exc, AGREED_ATTR, None)


def mark_shown(exc):
    """Note that ``exc`` was reported already (so that it is not printed again when uncaught)."""
    try:
        setattr(exc, SHOWN_ATTR, True)
    except AttributeError:
        pass


def shown(exc):
    """Return whether ``exc``'s report was printed already."""
    return bool(getattr(exc, SHOWN_ATTR, False))


def report_caught(exc, where):
    """Print the report of ``exc``, raised by every rank together, that this (reporting) rank caught
    while the others ended with it (``where``: e.g. 'at collective call #3'); mark it shown."""
    rank, host = rank_and_host()
    _write('chainermn: [rank {} host {}] the {} every rank raised together {} was caught on this '
           'rank, which reports it; the other ranks ended with it:\n{}: {}\n'.format(
               rank, host, type(exc).__name__, where, type(exc).__name__, str(exc).rstrip('\n')))
    mark_shown(exc)


def report_caught_elsewhere(exc_type, exc, tb):
    """Print the whole report of ``exc`` here: its reporting rank did not end the job (it caught it)."""
    _write(''.join(traceback.format_exception(exc_type, exc, tb)))
    mark_shown(exc)


# -- Ctrl-C: one short report per job ------------------------------------------------------
def on_interrupt(note):
    """Add ``note(trainer)`` (``trainer``: the Chainer ``Trainer`` running, or None) to the interrupt
    report: it returns a short phrase (e.g. the newest complete checkpoint) or None."""
    if note not in _interrupt_notes:
        _interrupt_notes.append(note)


def _frames(where):
    """Yield the frames of ``where`` (a traceback: its own, outermost first; a frame: it and down)."""
    if isinstance(where, types.TracebackType):   # not the innermost frame's f_back: a suspended
        while where is not None:                  # generator's frame (namedparams) has none
            yield where.tb_frame
            where = where.tb_next
        return
    while where is not None:
        yield where
        where = where.f_back


def _trainer_of(where):
    """Return the Chainer ``Trainer`` whose ``run`` is on the stack of ``where`` (see :func:`_frames`)."""
    for frame in _frames(where):
        obj = frame.f_locals.get('self') if frame.f_code.co_name in ('run', '_run') else None
        if obj is not None and type(obj).__name__ == 'Trainer' and hasattr(obj, 'updater'):
            return obj
    return None


def interrupted_line(frame=None):
    """Return the one line that reports a job ended by Ctrl-C: at which iteration of the ``Trainer``
    running on the stack of ``frame`` (a frame or a traceback; if any), and what the
    :func:`on_interrupt` notes add."""
    trainer = _trainer_of(frame)
    parts = ['chainermn: the job was interrupted (Ctrl-C)']
    if trainer is not None:
        try:
            parts[0] += ' at iteration {}'.format(int(trainer.updater.iteration))
        except Exception:
            pass
    for note in list(_interrupt_notes):
        try:
            phrase = note(trainer)
        except Exception:
            phrase = None
        if phrase:
            parts.append(phrase)
    return '; '.join(parts)


def _report_interrupt(tb):
    """Print the interrupt report on world rank 0; every other rank prints nothing."""
    if world_rank() in (0, None):
        report_interrupt_here(tb)


def report_interrupt_here(tb=None, frame=None):
    """Print the interrupt report from this rank, once per process (``tb``/``frame``: where to find the trainer)."""
    if _interrupt_state['reported']:
        return
    _interrupt_state['reported'] = True
    _write(interrupted_line(tb if tb is not None else frame) + '\n')


def end_interrupted(tb):
    """End a job of several ranks after Ctrl-C with ``MPI_Abort(INTERRUPT_STATUS)`` (never returns).

    Rank 0 reported it (:func:`report_uncaught`) and ends the job at once; any other rank first
    waits ``INTERRUPT_WAIT`` seconds for rank 0 to do so (it may be inside an MPI call that
    Ctrl-C does not interrupt), then reports it and ends the job itself.
    """
    import os
    import time
    try:
        sys.stdout.flush()
        sys.stderr.flush()
        if world_rank() in (0, None):
            time.sleep(_FLUSH_GRACE)
        else:
            time.sleep(INTERRUPT_WAIT)
            report_interrupt_here(tb)
            time.sleep(_FLUSH_GRACE)
    finally:
        try:
            from mpi4py import MPI
            if MPI.Is_initialized() and not MPI.Is_finalized():
                MPI.COMM_WORLD.Abort(INTERRUPT_STATUS)
        finally:
            os._exit(INTERRUPT_STATUS)


def _several_ranks():
    """Return whether this process is one rank of a job of several (MPI initialized, world size > 1)."""
    try:
        if 'mpi4py.MPI' not in sys.modules:
            return False
        from mpi4py import MPI
        return MPI.Is_initialized() and not MPI.Is_finalized() and MPI.COMM_WORLD.Get_size() > 1
    except Exception:
        return False


def decide(exc):
    """Return how this rank prints ``exc``: 'report' (in full), 'pointer' (one line) or 'shown' (nothing)."""
    if getattr(exc, SHOWN_ATTR, False):
        return 'shown'
    reporter = reporter_of(exc)
    if reporter is not None and reporter != world_rank():
        return 'pointer'
    return 'report'


def pointer_line(exc, where=''):
    """Return the one line of a rank whose error every rank raised together and another rank reports."""
    return '{}{}, raised by every rank together: rank {} reports it'.format(
        type(exc).__name__, where, reporter_of(exc))


def report_uncaught(exc_type, exc, tb, fallback):
    """Print an uncaught exception the job's way (``fallback(exc_type, exc, tb)`` prints in full); return :func:`decide`'s answer."""
    if isinstance(exc, KeyboardInterrupt) and type(exc) is KeyboardInterrupt:
        _report_interrupt(tb)
        mark_shown(exc)
        return 'interrupt'
    how = decide(exc)
    if how == 'report' and fallback is sys.__excepthook__:
        _write(''.join(traceback.format_exception(exc_type, exc, tb)))
    elif how == 'report':
        fallback(exc_type, exc, tb)
    if how == 'report':
        mark_shown(exc)
    elif how == 'pointer':
        _log.error('%s', pointer_line(exc))
    return how


def early_report(exc, tb, out=None):
    """Print what a Chainer ``Trainer`` prints when its loop raises, the job's way; mark ``exc`` shown.

    Rank 0 (and any rank whose error is its own) prints Chainer's report with the exception's
    type added; the other ranks of an error raised together print one line.
    """
    if decide(exc) == 'pointer':
        _log.error('%s', pointer_line(exc, ' in the main training loop'))
    else:
        _write('Exception in main training loop: {}: {}\nTraceback (most recent call last):\n{}'
               'Will finalize trainer extensions and updater before reraising the exception.\n'.format(
                   type(exc).__name__, exc, ''.join(traceback.format_tb(tb))), out)
    mark_shown(exc)


def _write(text, out=None):
    """Write a report with one call (lines of other ranks then land before or after it, not inside)."""
    out = sys.stderr if out is None else out
    try:
        sys.stdout.flush()
    except Exception:
        pass
    out.write(text)
    out.flush()


def _excepthook(exc_type, exc, tb):
    if report_uncaught(exc_type, exc, tb, _hook['previous']) == 'interrupt' and _several_ranks():
        end_interrupted(tb)  # one report, then the whole job ends (status 130)


_excepthook.chainermn_reports = True


def install():
    """Print uncaught exceptions the job's way from now on (wraps ``sys.excepthook`` once; no abort).

    Does nothing under :mod:`chainermn_comm.global_except_hook`, which does the same and aborts.
    """
    if _hook['previous'] is not None or getattr(sys.excepthook, 'chainermn_reports', False):
        return
    _hook['previous'] = sys.excepthook
    sys.excepthook = _excepthook
