"""Stop cleanly on SIGTERM: all ranks agree, write a checkpoint, and exit with a distinct status.

Schedulers and cloud preemption send SIGTERM and, after a grace period, SIGKILL.  The
signal handler installed here only sets a flag.  At every iteration boundary (after all
other extensions of that iteration ran) the ranks combine their flags with one tiny
all-reduce, so they all stop at the same iteration even when only some ranks got the
signal; then every rank saves through the multi-node checkpointer and the process
exits with :data:`PREEMPTED_EXIT_STATUS`.  The next launch resumes with
``checkpointer.maybe_load(trainer, optimizer)``.

Usage::

    checkpointer = create_multi_node_checkpointer('run1', comm)
    trainer.extend(checkpointer, trigger=(100, 'iteration'))
    chainermn_train.preemption.install(trainer, checkpointer, comm)
    checkpointer.maybe_load(trainer, optimizer)
    trainer.run()            # exits with status 75 when preempted
"""

import signal
import threading

import numpy
from chainer.training import extension

from chainermn_comm import protocol, trace
from chainermn_comm.log import get_logger

__all__ = ['PREEMPTED_EXIT_STATUS', 'Preempted', 'PreemptionHandler', 'install']

#: Exit status of a rank that stopped because of SIGTERM after writing a checkpoint
#: (``EX_TEMPFAIL`` from sysexits.h: "try again later" -- relaunch the job to resume).
PREEMPTED_EXIT_STATUS = protocol.PREEMPTED_EXIT_STATUS

_log = get_logger('train')


class Preempted(SystemExit):
    """Raised on every rank after the preemption checkpoint is written; exits with status 75."""

    def __init__(self, message=None):
        super().__init__(PREEMPTED_EXIT_STATUS)
        self.message = message

    def __str__(self):
        return self.message or 'preempted'


class PreemptionHandler(extension.Extension):
    """Trainer extension that turns SIGTERM into an agreed stop with a checkpoint.

    Args:
        checkpointer: object with ``save(trainer)`` (e.g. from ``create_multi_node_checkpointer``);
            None to stop without saving.
        comm: ChainerMN communicator the ranks agree over.
        signals: signals that request the stop (default: SIGTERM).
        check_interval (int): agree every this many iterations (one tiny all-reduce each time).

    After saving, :class:`Preempted` (a ``SystemExit`` with status 75) is raised out of
    ``trainer.run()``; training state is never marked finished, so checkpoints stay on disk.
    """

    trigger = (1, 'iteration')
    # Run after every other extension of the iteration, so the checkpoint holds the whole iteration.
    priority = -1000
    name = 'preemption'

    def __init__(self, checkpointer, comm, signals=(signal.SIGTERM,), check_interval=1):
        if int(check_interval) < 1:
            raise ValueError('check_interval must be a positive number of iterations; got {}'.format(
                check_interval))
        self.checkpointer = checkpointer
        self.comm = comm
        self.signals = tuple(signals)
        self.check_interval = int(check_interval)
        self.received = None
        self.stopped_at = None
        self._previous = {}
        self._calls = 0

    # -- signals ----------------------------------------------------------
    def install_signal_handlers(self):
        """Install the flag-setting handlers (main thread only); idempotent."""
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError('rank {}: signal handlers can only be installed from the main thread; '
                               'create the PreemptionHandler there'.format(self.comm.rank))
        for sig in self.signals:
            if sig not in self._previous:
                self._previous[sig] = signal.signal(sig, self._on_signal)
        return self

    def restore_signal_handlers(self):
        """Put back the handlers that were installed before."""
        if threading.current_thread() is not threading.main_thread():
            return
        for sig, prev in self._previous.items():
            signal.signal(sig, prev if prev is not None else signal.SIG_DFL)
        self._previous = {}

    def _on_signal(self, signum, frame):
        # Only set a flag: the rank may be inside an MPI call or writing a file.
        self.received = signum

    def request_stop(self):
        """Ask for a stop as if a signal had arrived on this rank."""
        self.received = self.received or signal.SIGTERM

    # -- agreement ------------------------------------------------------------
    def should_stop(self):
        """Return True on every rank when any rank received a stop signal (collective)."""
        flag = numpy.array([1 if self.received is not None else 0], dtype=numpy.int32)
        agreed = self.comm.allreduce(flag, op='max')
        return bool(int(numpy.asarray(agreed)[0]))

    def check(self, target):
        """At an iteration boundary: if any rank was signalled, save ``target`` on every rank and stop."""
        self._calls += 1
        if self._calls % self.check_interval:
            return False
        if not self.should_stop():
            return False
        iteration = _iteration_of(target)
        self.stopped_at = iteration
        if self.checkpointer is not None:
            self.checkpointer.save(target)
            settle = getattr(self.checkpointer, 'settle', None)
            if settle is not None:   # a background write: every rank waits for it and agrees
                settle()
        # Nobody exits before every rank's checkpoint is on disk.
        self.comm.allreduce(numpy.zeros(1, numpy.int32))
        why = ('this rank received {}'.format(_signal_name(self.received)) if self.received is not None
               else 'another rank received a stop signal')
        message = ('chainermn: rank {}: preempted ({}); all ranks stop at iteration {}; checkpoint {}; '
                   'exiting with status {}. Relaunch the job to resume.'.format(
                       self.comm.rank, why, iteration,
                       'written' if self.checkpointer is not None else 'NOT written (no checkpointer)',
                       PREEMPTED_EXIT_STATUS))
        _log.warning(message)
        if trace.ON:
            trace.flush('sigterm')  # every rank writes its part; the last one merges them
        return True

    # -- trainer extension ------------------------------------------------------
    def initialize(self, trainer):
        self.install_signal_handlers()

    def __call__(self, trainer):
        if not self.check(trainer):
            return
        self.restore_signal_handlers()
        raise Preempted('rank {}: preempted at iteration {}'.format(self.comm.rank, self.stopped_at))

    def finalize(self):
        self.restore_signal_handlers()


def install(trainer, checkpointer, comm, **kwargs):
    """Create a :class:`PreemptionHandler`, install its signal handlers now, and extend ``trainer``."""
    handler = PreemptionHandler(checkpointer, comm, **kwargs)
    handler.install_signal_handlers()
    trainer.extend(handler, name=PreemptionHandler.name, trigger=(1, 'iteration'),
                   priority=PreemptionHandler.priority)
    return handler


def _iteration_of(target):
    updater = getattr(target, 'updater', None)
    if updater is not None and hasattr(updater, 'iteration'):
        return updater.iteration
    return getattr(target, 'iteration', None)


def _signal_name(signum):
    try:
        return signal.Signals(signum).name
    except (ValueError, TypeError):
        return str(signum)
