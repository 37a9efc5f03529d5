"""What chainermn changes in the whole process, decided in one place, with one switch to leave it alone.

Every process-wide effect (:data:`EFFECTS`: a hook in ``sys``, a patched class, a variable written
into ``os.environ``) is installed through :func:`install` from here: the installers keep their
bodies where they belong (:mod:`chainermn_comm.voice`, :mod:`chainermn_comm.guard.exit_status`,
:mod:`chainermn_comm.threads`, ``chainermn_train``'s ``Trainer.run`` wrapper), this module decides
whether they run and lists what did (:func:`installed`).  docs/process.md is the table.

A program that embeds chainermn in a larger one may want none of them: ``CHAINERMN_PROCESS_WIDE=0``
in the environment, or :func:`leave_alone` called before the first ``create_communicator``,
leaves the process alone (no ``sys.excepthook``, no ``sys.exit`` wrapper, no ``Trainer.run``
patch, no thread-pool sizing and no ``OMP_NUM_THREADS`` & co written).  What you ask for by name
is still done: ``chainermn.global_except_hook.add_hook()``,
``CHAINERMN_FORCE_ABORT_ON_EXCEPTION=1`` and ``CHAINERMN_THREADS=N``.
"""

import collections
import threading

from chainermn_comm import settings
from chainermn_comm.protocol import FORCE_ABORT_ENV, PROCESS_WIDE_ENV

__all__ = ['Effect', 'EFFECTS', 'SWITCH', 'leave_alone', 'left_alone', 'install', 'installed',
           'on_import', 'on_communicator']

#: The environment variable whose ``0`` leaves the process alone.
SWITCH = PROCESS_WIDE_ENV

#: One process-wide effect: what it changes, when it is installed, why.
Effect = collections.namedtuple('Effect', 'name changes when why')

#: Every process-wide effect chainermn installs on its own, by name (docs/process.md lists them).
EFFECTS = collections.OrderedDict((e.name, e) for e in [
    Effect('excepthook', 'sys.excepthook (chainermn_comm.voice)',
           'the first create_communicator',
           'an error every rank raised together is printed once, by rank 0; the others print one '
           'line pointing at it'),
    Effect('sys.exit', 'sys.exit, wrapped to note its status (chainermn_comm.guard.exit_status)',
           'the first communicator whose exit notice is on (CHAINERMN_EXIT_NOTICE)',
           'the exit notice tells the other ranks the status a rank\'s sys.exit(n) ends it with, '
           'so that the job ends with n'),
    Effect('thread pools', 'the BLAS and OpenMP pools (threadpoolctl) and OMP_NUM_THREADS, '
           'OPENBLAS_NUM_THREADS, MKL_NUM_THREADS, CHAINERMN_THREADS_CHOSEN in os.environ '
           '(chainermn_comm.threads)',
           'the first create_communicator, unless the user set one of those variables',
           'N ranks on a node would otherwise run N x cores spinning threads'),
    Effect('Trainer.run', 'chainer.training.Trainer.run, wrapped (chainermn_train)',
           'the first multi-node optimizer, evaluator or checkpointer',
           'an error in the training loop is reported once, before the extensions are finalized; '
           'chainermn\'s lines never land inside a PrintReport table'),
    Effect('abort hook', 'sys.excepthook and threading.excepthook, and sys.exit wrapped '
           '(chainermn_comm.global_except_hook)',
           'only when you ask: CHAINERMN_FORCE_ABORT_ON_EXCEPTION=1 (at import) or '
           'global_except_hook.add_hook(); done even when the process is left alone',
           'an uncaught exception or sys.exit(n) on one rank ends the whole job (MPI_Abort)'),
    Effect('MPICH netmod', 'MPIR_CVAR_CH4_NETMOD=ofi in os.environ (chainermn_comm._slurm_pmi)',
           'import of chainermn_comm, only under srun --mpi=pmi2 with the mpich wheel (and '
           'CHAINERMN_SLURM_PMI_FIX not 0)',
           'MPICH\'s UCX netmod hangs in MPI_Init under Slurm\'s pmi2 plugin'),
])

_lock = threading.RLock()
_state = {'alone': False, 'installed': [], 'asked': set()}


def left_alone(environ=None):
    """Return whether the process is left alone (``leave_alone()`` was called, or the switch is 0)."""
    if _state['alone']:
        return True
    try:
        return not settings.read(SWITCH, environ=environ)
    except ValueError:   # not understood: create_communicator's environment check says so
        return False


def leave_alone():
    """Install nothing process-wide from now on; call it before the first ``create_communicator``.

    Raises RuntimeError when an effect was installed already (too late to leave it out).
    """
    with _lock:
        early = [name for name in _state['installed']   # not what import or the user did
                 if name != 'MPICH netmod' and name not in _state['asked']]
        if early and not _state['alone']:
            raise RuntimeError('chainermn_comm.process.leave_alone() is called after chainermn '
                               'installed {} in this process; call it before the first '
                               'create_communicator (or set {}=0 in the environment)'.format(
                                   ', '.join(early), SWITCH))
        _state['alone'] = True


def install(name, installer, asked=False):
    """Run ``installer()`` for effect ``name`` of :data:`EFFECTS` unless the process is left alone.

    ``asked``: the user asked for it by name (it runs even when the process is left alone).
    Returns whether it ran.  Installers are idempotent; one that returns False found nothing to
    do (it is not listed); each effect is listed once.
    """
    if name not in EFFECTS:
        raise KeyError('{!r} is not a process-wide effect chainermn lists; add it to '
                       'chainermn_comm.process.EFFECTS and docs/process.md'.format(name))
    with _lock:
        if left_alone() and not asked:
            return False
        if installer() is not False and name not in _state['installed']:
            _state['installed'].append(name)
            if asked:
                _state['asked'].add(name)
        return True


def installed():
    """Return the names of the effects installed in this process so far, in order."""
    return list(_state['installed'])


def on_import():
    """Install what must precede MPI_Init and what the user asked for at import (``chainermn_comm`` calls it)."""
    from chainermn_comm import _slurm_pmi, global_except_hook
    install('MPICH netmod', lambda: _slurm_pmi.apply()[0])

    def abort_hook():
        try:
            enabled = settings.read(FORCE_ABORT_ENV)
        except ValueError:   # not understood: create_communicator's environment check raises it
            return False
        return global_except_hook.add_hook() if enabled else False
    install('abort hook', abort_hook, asked=True)


def on_communicator():
    """Install what a communicator needs in the process (``create_communicator`` calls it first)."""
    from chainermn_comm import voice
    install('excepthook', voice.install)
