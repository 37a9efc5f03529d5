"""The ``chainermn`` logger: every record carries the rank and host it came from.

>>> from chainermn_comm.log import get_logger
>>> logger = get_logger('watchdog')        # the logger 'chainermn.watchdog'
>>> logger.warning('waited %d s', 60)      # chainermn: [rank 0 host node1] waited 60 s

Records have ``rank`` and ``host`` attributes (``%(rank)s``, ``%(host)s`` in a format).  Until
the user configures logging (a handler on the ``chainermn`` logger or on the root logger), a
default handler writes them to ``sys.stderr`` as ``chainermn: [rank R host H] message``,
flushed at once (the watchdog logs while the process dies); a record with the attribute
``chainermn_plain`` (the straggler line, which names another rank) is written as its message alone.  Silence or redirect them the usual
way: ``logging.getLogger('chainermn').setLevel(logging.CRITICAL)``, or add a handler.  Warnings
stay :mod:`warnings`.

Lines that do not cut into a reporter's table: while :func:`holding` is in effect (a Chainer
``Trainer`` whose ``PrintReport`` or ``ProgressBar`` writes to this process's stdout is running:
``chainermn_train`` sets it), the default handler keeps records below ``WARNING`` (the tuner's
choice, ...) and writes them, in order, when the run ends (:func:`release`).  Warnings and errors
(a stall, a straggler, a rank that left) are written at once, as whole lines, after stdout is
flushed so that they follow the table's rows already printed.  A handler the user configured
gets every record at once.
"""

import contextlib
import logging
import os
import socket
import sys
import threading

__all__ = ['get_logger', 'LOGGER_NAME', 'FORMAT', 'rank_and_host', 'holding', 'release']

#: Name of the logger every chainermn logger descends from.
LOGGER_NAME = 'chainermn'
#: Format of the default handler.
FORMAT = 'chainermn: [rank %(rank)s host %(host)s] %(message)s'

_host = []
#: Records the default handler keeps while :func:`holding` (``depth``: nested holds).
_held = {'depth': 0, 'records': []}
_held_lock = threading.Lock()


def rank_and_host():
    """Return (rank in MPI.COMM_WORLD, else the launcher's rank variable, else '?'; host name)."""
    rank = None
    try:
        if 'mpi4py.MPI' in sys.modules:
            from mpi4py import MPI
            if MPI.Is_initialized() and not MPI.Is_finalized():
                rank = MPI.COMM_WORLD.Get_rank()
    except Exception:
        pass
    if rank is None:
        for name in ('PMI_RANK', 'OMPI_COMM_WORLD_RANK', 'PMIX_RANK', 'SLURM_PROCID'):
            if name in os.environ:
                rank = os.environ[name]
                break
        else:
            rank = '?'
    if not _host:
        _host.append(socket.gethostname())  # never imports mpi4py.MPI: that would initialise MPI
    return rank, _host[0]


class _RankFilter(logging.Filter):
    """Put ``rank`` and ``host`` into each record (unless the caller gave them in ``extra``)."""

    def filter(self, record):
        if not hasattr(record, 'rank') or not hasattr(record, 'host'):
            rank, host = rank_and_host()
            if not hasattr(record, 'rank'):
                record.rank = rank
            if not hasattr(record, 'host'):
                record.host = host
        return True


class _DefaultHandler(logging.Handler):
    """Write to the current ``sys.stderr`` and flush, unless the user configured a handler."""

    def __init__(self):
        super().__init__()
        self.setFormatter(logging.Formatter(FORMAT))

    def emit(self, record):
        top = logging.getLogger(LOGGER_NAME)
        if any(h is not self for h in top.handlers) or logging.getLogger().handlers:
            return  # the user decides where records go
        if record.levelno < logging.WARNING:
            with _held_lock:
                if _held['depth']:
                    record.msg, record.args = record.getMessage(), None  # as it reads now
                    _held['records'].append(record)
                    return
        self.write(record)

    def write(self, record):
        """Write one record as a whole line to the current ``sys.stderr``, after stdout's lines."""
        try:
            _flush_stdout()
            stream = sys.stderr
            # A record with ``chainermn_plain`` (e.g. the straggler line, which names another
            # rank) is written as its message alone.
            text = record.getMessage() if getattr(record, 'chainermn_plain', False) \
                else self.format(record)
            stream.write(text + '\n')
            stream.flush()
        except Exception:
            self.handleError(record)


def _flush_stdout():
    try:
        sys.stdout.flush()
    except Exception:  # closed or broken: the record still goes to stderr
        pass


_filter = _RankFilter()
_default = _DefaultHandler()


@contextlib.contextmanager
def holding():
    """Keep the default handler's records below WARNING until the outermost hold ends, then write them."""
    with _held_lock:
        _held['depth'] += 1
    try:
        yield
    finally:
        with _held_lock:
            _held['depth'] -= 1
            last = _held['depth'] == 0
        if last:
            release()


def release():
    """Write the records kept so far, in order (the hold, if any, goes on)."""
    with _held_lock:
        records, _held['records'] = _held['records'], []
    for record in records:
        _default.write(record)


def _setup():
    top = logging.getLogger(LOGGER_NAME)
    if _filter not in top.filters:
        top.addFilter(_filter)
    if _default not in top.handlers:
        _default.addFilter(_filter)  # records of any child logger get rank and host too
        top.addHandler(_default)
        if top.level == logging.NOTSET:
            top.setLevel(logging.INFO)  # chainermn's INFO lines (loaded generation ...) are shown
    return top


def get_logger(name=None):
    """Return the logger ``chainermn.<name>`` (``chainermn`` itself when ``name`` is None)."""
    top = _setup()
    if not name:
        return top
    logger = top.getChild(name)
    if _filter not in logger.filters:
        logger.addFilter(_filter)
    return logger
