"""Chainer's ``Trainer.run`` the job's way: one report of an error, library lines outside the table.

Installed the first time a multi-node optimizer, evaluator or checkpointer is created (a program
that trains with chainermn), through ``chainermn_comm.process`` (which lists it, and leaves it out
when the process is left alone: ``CHAINERMN_PROCESS_WIDE=0``); ``Trainer.run`` then works as
before, with two differences:

- When its loop raises, Chainer prints ``Exception in main training loop``, the traceback and
  ``Will finalize ...`` on every rank before it finalizes the extensions (a finalizer may hang),
  and Python prints the traceback again when the error is not caught.  Here the same report is
  printed at the same point (an ``on_error`` handler that runs first, with the exception's type
  added), once: an error that every rank raised together (``chainermn_comm.voice``) is reported
  by rank 0 only, the other ranks print one line; the exception is marked as reported, so that
  the uncaught-exception hook does not print it again.  ``run(show_loop_exception_msg=False)``
  prints nothing, as in Chainer.
- While a ``PrintReport`` or ``ProgressBar`` of the trainer writes to this process's stdout,
  chainermn's information lines (``chainermn_comm.log.holding``) are kept and written when the
  run ends, so that they never land inside the table.
"""

import contextlib
import functools

import chainer
from chainer.training import extensions as chainer_extensions

from chainermn_comm import log, process, voice

__all__ = ['install', 'EXTENSION_NAME']

#: Name of the extension that prints the early report.
EXTENSION_NAME = 'chainermn_error_report'
_REPORTERS = (chainer_extensions.PrintReport, chainer_extensions.ProgressBar)
_state = {'original': None}


def _never(trainer):
    return False


class _EarlyReport(chainer.training.Extension):
    """Print the report of an error raised in the loop, before the extensions are finalized."""

    priority = 1 << 30   # its on_error runs before every other extension's

    def __call__(self, trainer):
        pass

    def on_error(self, trainer, exc, tb):
        log.release()   # the lines held so far go before the report
        voice.early_report(exc, tb)


def _reports(trainer):
    """Return whether an extension of ``trainer`` prints a table or a progress bar."""
    return any(isinstance(entry.extension, _REPORTERS) for entry in trainer._extensions.values())


def _run(self, show_loop_exception_msg=True):
    original = _state['original']
    hold = log.holding() if _reports(self) else contextlib.nullcontext()
    with hold:
        if show_loop_exception_msg and EXTENSION_NAME not in self._extensions:
            self.extend(_EarlyReport(), name=EXTENSION_NAME, trigger=_never)
        return original(self, show_loop_exception_msg=False)


def _patch():
    if _state['original'] is not None:
        return
    original = chainer.training.Trainer.run
    _state['original'] = original
    chainer.training.Trainer.run = functools.wraps(original)(_run)


def install():
    """Wrap ``chainer.training.Trainer.run`` once, unless the process is left alone (module docstring)."""
    process.install('Trainer.run', _patch)
