"""Tell ``python -m chainermn launch`` how far the job got, through the launch status file.

When ``$CHAINERMN_LAUNCH_PROGRESS`` names a file, rank 0 keeps it up to date (a JSON object,
replaced atomically; see ``chainermn_comm.launch_status``): ``generation`` after
loading (None when nothing was loaded), ``first_iteration_wall`` after the first iteration and
``iteration`` after every iteration (the launcher counts redone work).
"""

import time

import chainer

from chainermn_comm import launch_status, protocol, settings

__all__ = ['LaunchStatus']

_EXTENSION_NAME = 'chainermn_launch_progress'


class LaunchStatus:
    """Rank 0's writer of the launch status file; does nothing without ``$CHAINERMN_LAUNCH_PROGRESS``."""

    def __init__(self, comm):
        path = settings.read(protocol.LAUNCH_STATUS_ENV)
        self._writer = launch_status.LaunchStatusWriter(path) if path and comm.rank == 0 else None

    @property
    def active(self):
        """Whether this rank writes the launch status file."""
        return self._writer is not None

    def _update(self, **fields):
        try:
            self._writer.update(**fields)
        except OSError:   # the launcher only loses a progress report; training goes on
            pass

    def loaded(self, generation, trainer):
        """Record the loaded generation (or None) and follow ``trainer``'s iterations from now on."""
        if self._writer is None:
            return
        self._update(generation=generation)
        if not isinstance(trainer, chainer.training.Trainer) or _EXTENSION_NAME in trainer._extensions:
            return
        state = {'first': True}

        def report(t):
            fields = {'iteration': int(t.updater.iteration)}
            if state['first']:
                state['first'] = False
                fields['first_iteration_wall'] = time.time()
            self._update(**fields)

        trainer.extend(report, name=_EXTENSION_NAME, trigger=(1, 'iteration'),
                       priority=chainer.training.PRIORITY_READER)
