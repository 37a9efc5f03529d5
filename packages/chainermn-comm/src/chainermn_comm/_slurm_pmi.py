"""Make ``srun --mpi=pmi2`` work with the ``mpich`` wheel: pick MPICH's OFI netmod before MPI_Init.

Why: under srun's mpi/pmi2 plugin MPICH speaks the PMI-1 wire protocol, and Slurm (22.05 and
later) reads each PMI-1 request with a single ``read()`` of at most 1024 bytes while announcing
``vallen_max=1024``.  MPICH's UCX netmod publishes a 4096-byte business card per rank (the UCX
address followed by uninitialised padding), hex-encoded with runs of zero bytes compressed, in
segments of up to 1024 characters; a ``cmd=put ... value=<segment>`` line is then up to ~1080
bytes.  When MPI_Init runs late in a process whose heap is already dirty (after ``import
chainer``: the padding holds stale pointers instead of zeros), segments stop compressing, a
line passes 1024 bytes, slurmstepd logs ``mpi/pmi2: value not properly terminated in client
request`` and the rank waits forever for the reply.  The OFI netmod's card is a few dozen
bytes.  See docs/cluster.md, section "Slurm".
"""

import os
import sys

from chainermn_comm import settings
from chainermn_comm.protocol import SLURM_PMI_FIX_ENV

__all__ = ['FIX_ENV', 'NETMOD_CVAR', 'under_srun_pmi', 'mpich_wheel_installed', 'decide',
           'apply', 'state']

#: Set to 0 to keep the UCX netmod under srun (e.g. when MPIR_CVAR_CH4_NETMOD is set elsewhere).
FIX_ENV = SLURM_PMI_FIX_ENV
#: The MPICH control variable that selects the ch4 network module.
NETMOD_CVAR = 'MPIR_CVAR_CH4_NETMOD'

#: What apply() did in this process: (applied, reason); None before it ran.
_state = [None]


def under_srun_pmi(env=None):
    """Return True when this process was started by srun with a PMI-1/PMI-2 server (mpi/pmi2)."""
    env = os.environ if env is None else env
    # srun's tasks carry SLURM_STEP_ID and the plugin's PMI_FD/PMI_JOBID; Hydra's mpiexec inside
    # an allocation also sets PMI_FD (its ranks inherit SLURM_STEP_ID from the srun that started
    # its proxies) but adds MPI_LOCALNRANKS, and its PMI server reads long lines correctly.
    if 'PMI_FD' not in env or 'SLURM_STEP_ID' not in env or 'MPI_LOCALNRANKS' in env:
        return False
    return env.get('SLURM_MPI_TYPE', 'pmi2').lower() in ('pmi2', 'pmi1', 'pmi')


def mpich_wheel_installed():
    """Return True when the ``mpich`` wheel from PyPI (ch4 with both UCX and OFI) is installed."""
    try:
        import importlib.metadata as metadata
        metadata.version('mpich')
        return True
    except Exception:
        return False


def decide(env=None, mpi_initialized=None, have_wheel=None):
    """Return (apply?, reason) for the srun + mpi/pmi2 + MPICH/UCX workaround."""
    env = os.environ if env is None else env
    if not under_srun_pmi(env):
        return False, 'not started by srun with --mpi=pmi2'
    if not settings.read(FIX_ENV, environ=env):
        return False, '{}=0'.format(FIX_ENV)
    if NETMOD_CVAR in env:
        return False, '{}={} set by the user'.format(NETMOD_CVAR, env[NETMOD_CVAR])
    if mpi_initialized is None:
        mpi_initialized = 'mpi4py.MPI' in sys.modules
    if mpi_initialized:
        return False, 'mpi4py.MPI was imported (MPI initialised) before chainermn'
    if have_wheel is None:
        have_wheel = mpich_wheel_installed()
    if not have_wheel:
        return False, 'MPI is not the mpich wheel'
    return True, 'srun --mpi=pmi2 with the mpich wheel: {}=ofi'.format(NETMOD_CVAR)


def apply(env=None):
    """Set MPIR_CVAR_CH4_NETMOD=ofi when decide() says so; return (applied, reason). Idempotent."""
    if env is None and _state[0] is not None:
        return _state[0]
    target = os.environ if env is None else env
    try:
        applied, reason = decide(target)
    except ValueError as e:  # a bad $CHAINERMN_SLURM_PMI_FIX: create_communicator raises it
        applied, reason = False, str(e)
    if applied:
        target[NETMOD_CVAR] = 'ofi'
    if env is None:
        _state[0] = (applied, reason)
    return applied, reason


def state():
    """Return (applied, reason) of the apply() done at import of chainermn_comm, or None."""
    return _state[0]
