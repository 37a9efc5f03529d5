"""create_communicator, and the one set-up that it and every communicator's constructor share.

``create_communicator(name, mpi_comm, ...)`` and a direct constructor (``NaiveCommunicator(mpi_comm)``,
``PureNcclCommunicator(mpi_comm)``, a user's subclass of ``MpiCommunicatorBase``, as Chainer v7's
code makes them) give the same communicator: both run :func:`set_up` once, on every rank of
``mpi_comm`` together, before the communicator is built.
"""

import contextlib
import importlib
import threading

from chainermn_comm import _gpu_support
from chainermn_comm import log, process, same_settings, settings, spelling, voice

__all__ = ['create_communicator', 'set_up', 'set_up_for', 'already_set_up', 'COMMUNICATOR_NAMES',
           'CPUModeWarning', 'DEFAULT_NAME']

#: Every name create_communicator accepts (and v7's ``'dummy'``: no communication, for measuring).
COMMUNICATOR_NAMES = ('naive', 'flat', 'hierarchical', 'two_dimensional', 'single_node',
                      'pure_nccl', 'non_cuda_aware')
#: The communicator without a name (None): this one where a GPU is usable, else ``naive``.
DEFAULT_NAME = 'hierarchical'
_HIDDEN_NAMES = ('dummy',)
_NEEDS_GPU = {'flat', 'hierarchical', 'two_dimensional', 'single_node', 'pure_nccl', 'non_cuda_aware'}
_NEEDS_NCCL = {'hierarchical', 'two_dimensional', 'single_node', 'pure_nccl', 'non_cuda_aware'}
#: name -> (module, class) of every communicator create_communicator builds.
_CLASSES = {
    'naive': ('chainermn_comm.naive', 'NaiveCommunicator'),
    'dummy': ('chainermn_comm.dummy', 'DummyCommunicator'),
}

_state = threading.local()


class CPUModeWarning(UserWarning):
    """Kept for code that filters it: the default communicator on CPUs (``naive``) no longer warns."""


def _check(name, named):
    """Check the settings and ``name``; return the name of the communicator to build (local)."""
    settings.check_environment()
    if not named:   # a constructor's class (a user's subclass may have any name): GPU needs only
        if name in _NEEDS_GPU:
            _gpu_support.require_gpu(name, needs_nccl=name in _NEEDS_NCCL)
        return name
    if name is None:
        if _gpu_support.gpu_available():
            name = DEFAULT_NAME
        else:   # the documented default on CPUs: no warning (issue 54), a debug line only
            log.get_logger('comm').debug('create_communicator(): %s; using naive',
                                         _gpu_support.cupy_status()[1])
            return 'naive'
    if not isinstance(name, str) or name not in COMMUNICATOR_NAMES + _HIDDEN_NAMES:
        raise ValueError('unknown communicator name {!r}.{} Valid names are: {} (or None for the '
                         'default: {} with a GPU, else naive)'.format(
                             name, spelling.did_you_mean(name, COMMUNICATOR_NAMES),
                             ', '.join(COMMUNICATOR_NAMES), DEFAULT_NAME))
    if name in _NEEDS_GPU:
        _gpu_support.require_gpu(name, needs_nccl=name in _NEEDS_NCCL)
    return name


def set_up(name, mpi_comm, named=True, allreduce_grad_dtype=None):
    """Prepare this process and every rank of ``mpi_comm`` for a communicator; return ``(name, mpi_comm)``.

    The one set-up of ``create_communicator`` and of every communicator's constructor. Collective
    (one ``allgather``): every ``CHAINERMN_*`` variable that is set is checked, with the name, on
    every rank together: a value or name that cannot be used raises on every rank, and each warning
    is shown once, by rank 0, naming the ranks when not every rank gave it. From here on uncaught
    exceptions are printed the job's way (:mod:`chainermn_comm.voice`). ``name`` is what
    ``create_communicator`` was given (None: the default, resolved here) or, with ``named=False``,
    a constructor's class name (only its GPU needs are checked). ``mpi_comm`` None is
    ``MPI.COMM_WORLD``. The ranks also agree on the settings that change what they send and on
    ``allreduce_grad_dtype`` (:mod:`chainermn_comm.same_settings`).
    """
    def check():
        return _check(name, named)

    if mpi_comm is None:
        try:
            from chainermn_comm._mpi_library import MPI
        except Exception:
            check()   # a bad name or setting is said before the missing MPI library
            raise
        mpi_comm = MPI.COMM_WORLD
    process.on_communicator()   # the process-wide effects a communicator needs (docs/process.md)
    if callable(getattr(mpi_comm, 'allgather', None)) and callable(getattr(mpi_comm, 'Get_rank', None)):
        name = voice.together(mpi_comm, check, 'create_communicator')
        same_settings.agree(mpi_comm, allreduce_grad_dtype)   # before anything that depends on them
    else:   # not an mpi4py communicator: the communicator's own check says so
        name = check()
    return name, mpi_comm


@contextlib.contextmanager
def already_set_up(mpi_comm):
    """While inside, a communicator constructed on ``mpi_comm`` skips :func:`set_up` (done already)."""
    previous = getattr(_state, 'done', None)
    _state.done = mpi_comm
    try:
        yield
    finally:
        _state.done = previous


def set_up_for(cls, mpi_comm, allreduce_grad_dtype=None):
    """Run :func:`set_up` for a constructor of ``cls`` unless it ran for ``mpi_comm``; return ``mpi_comm``."""
    done = getattr(_state, 'done', None)
    if done is not None and done is mpi_comm:
        _state.done = None   # for this one construction only
        return done
    return set_up(getattr(cls, 'name', None), mpi_comm, named=False,
                  allreduce_grad_dtype=allreduce_grad_dtype)[1]


def create_communicator(communicator_name=None, mpi_comm=None, allreduce_grad_dtype=None,
                        batched_copy=False, timeout=None):
    """Create a ChainerMN communicator.

    Args:
        communicator_name (str): ``naive``, ``flat``, ``hierarchical``, ``two_dimensional``,
            ``single_node``, ``pure_nccl`` or ``non_cuda_aware``.  None (the default) means
            ``hierarchical`` where a GPU is usable and ``naive`` on CPUs, silently.
        mpi_comm: mpi4py communicator (``MPI.COMM_WORLD`` when None).
        allreduce_grad_dtype: dtype gradients are all-reduced in (None: the model's dtype).
        batched_copy (bool): pack GPU gradients with one kernel launch.
        timeout (float): watchdog timeout in seconds for every blocking call
            (None: ``$CHAINERMN_TIMEOUT`` or 30 minutes; 0: off).

    Returns:
        A communicator implementing :class:`chainermn.CommunicatorBase`: the same one the
        class's constructor gives (``NaiveCommunicator(mpi_comm)``).

    Every ``CHAINERMN_*`` variable that is set is checked first, with the name, on every rank
    together (one ``allgather``; :func:`set_up`).
    """
    name, mpi_comm = set_up(communicator_name, mpi_comm, allreduce_grad_dtype=allreduce_grad_dtype)
    kwargs = dict(mpi_comm=mpi_comm, allreduce_grad_dtype=allreduce_grad_dtype,
                  batched_copy=batched_copy, timeout=timeout)
    if name in _CLASSES:
        module, cls = _CLASSES[name]
        cls = getattr(importlib.import_module(module), cls)
    else:
        from chainermn_comm import gpu
        module, cls = gpu.GPU_COMMUNICATORS[name]
        cls = getattr(importlib.import_module(module), cls)
    with already_set_up(mpi_comm):
        return cls(**kwargs)
