"""create_communicator: pick and build a communicator by name."""

import warnings

from chainermn_comm import _gpu_support
from chainermn_comm import process, same_settings, settings, spelling, voice

__all__ = ['create_communicator', 'COMMUNICATOR_NAMES', 'CPUModeWarning']

#: Every name create_communicator accepts.
COMMUNICATOR_NAMES = ('naive', 'flat', 'hierarchical', 'two_dimensional', 'single_node',
                      'pure_nccl', 'non_cuda_aware')
_NEEDS_NCCL = {'hierarchical', 'two_dimensional', 'single_node', 'pure_nccl', 'non_cuda_aware'}


class CPUModeWarning(UserWarning):
    """Warned when the default communicator falls back to ``naive`` on a machine without a GPU."""


class _DefaultName(str):
    """The default communicator name; lets create_communicator tell 'not given' from 'given'."""


_DEFAULT = _DefaultName('hierarchical')


def create_communicator(communicator_name=_DEFAULT, mpi_comm=None, allreduce_grad_dtype=None,
                        batched_copy=False, timeout=None):
    """Create a ChainerMN communicator.

    Args:
        communicator_name (str): ``naive``, ``flat``, ``hierarchical``, ``two_dimensional``,
            ``single_node``, ``pure_nccl`` or ``non_cuda_aware``.  Without a name on a
            machine with no usable GPU, ``naive`` is used with a warning.
        mpi_comm: mpi4py communicator (``MPI.COMM_WORLD`` when None).
        allreduce_grad_dtype: dtype gradients are all-reduced in (None: the model's dtype).
        batched_copy (bool): pack GPU gradients with one kernel launch.
        timeout (float): watchdog timeout in seconds for every blocking call
            (None: ``$CHAINERMN_TIMEOUT`` or 30 minutes; 0: off).

    Returns:
        A communicator implementing :class:`chainermn.CommunicatorBase`.

    Every ``CHAINERMN_*`` variable that is set is checked first, with the name, on every rank
    together (one ``allgather``): a value that cannot be understood raises ValueError on every
    rank, and each warning is shown once, by rank 0, naming the ranks when not every rank gave it.
    From here on uncaught exceptions are printed the job's way (:mod:`chainermn_comm.voice`).
    """
    def check():
        settings.check_environment()
        name = communicator_name
        if not isinstance(name, str) or name not in COMMUNICATOR_NAMES:
            raise ValueError('unknown communicator name {!r}.{} Valid names are: {}'.format(
                name, spelling.did_you_mean(name, COMMUNICATOR_NAMES), ', '.join(COMMUNICATOR_NAMES)))
        if name is _DEFAULT and not _gpu_support.gpu_available():
            warnings.warn_explicit(
                'using naive communicator because only naive supports CPU-only execution',
                CPUModeWarning, 'chainermn', 0)
            name = 'naive'
        if name != 'naive':
            _gpu_support.require_gpu(name, needs_nccl=name in _NEEDS_NCCL)
        return name

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
    kwargs = dict(mpi_comm=mpi_comm, allreduce_grad_dtype=allreduce_grad_dtype,
                  batched_copy=batched_copy, timeout=timeout)
    if name == 'naive':
        from chainermn_comm.naive import NaiveCommunicator
        return NaiveCommunicator(**kwargs)
    from chainermn_comm import gpu
    return gpu.create_gpu_communicator(name, **kwargs)
