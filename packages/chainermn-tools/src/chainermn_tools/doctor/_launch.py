"""Tell a healthy MPI launch from N processes that each came up as a singleton 'rank 0 of 1'."""

import os

__all__ = ['SIZE_VARS', 'RANK_VARS', 'LAUNCHERS', 'launcher_env', 'launcher_of', 'sibling_singletons',
           'diagnose', 'explain']

#: Environment variables in which launchers announce the job size (first match is reported).
SIZE_VARS = ('PMI_SIZE', 'OMPI_COMM_WORLD_SIZE', 'MV2_COMM_WORLD_SIZE', 'SLURM_STEP_NUM_TASKS')
#: Launcher variables holding the number of ranks on this node (a lower bound on the job size).
LOCAL_SIZE_VARS = ('MPI_LOCALNRANKS', 'OMPI_COMM_WORLD_LOCAL_SIZE')
#: Environment variables in which launchers announce this process's rank.
RANK_VARS = ('PMI_RANK', 'OMPI_COMM_WORLD_RANK', 'PMIX_RANK', 'MV2_COMM_WORLD_RANK')
#: Process names of MPI launchers and their per-node proxies (as in /proc/PID/comm).
LAUNCHERS = frozenset(['hydra_pmi_proxy', 'mpiexec', 'mpirun', 'mpiexec.hydra', 'mpirun_rsh',
                       'orted', 'prted', 'prterun', 'srun', 'slurmstepd'])


def _int_env(env, name):
    try:
        return int(env.get(name, ''))
    except ValueError:
        return None


def launcher_env(env=None):
    """Return (size, size_var, local_size, local_var, rank, rank_var) that the launcher announced."""
    env = os.environ if env is None else env
    size = size_var = local = local_var = rank = rank_var = None
    for name in SIZE_VARS:
        if _int_env(env, name) is not None:
            size, size_var = _int_env(env, name), name
            break
    for name in LOCAL_SIZE_VARS:
        if _int_env(env, name) is not None:
            local, local_var = _int_env(env, name), name
            break
    for name in RANK_VARS:
        if _int_env(env, name) is not None:
            rank, rank_var = _int_env(env, name), name
            break
    return size, size_var, local, local_var, rank, rank_var


def _read(path, mode='r'):
    with open(path, mode) as f:
        return f.read()


def sibling_singletons():
    """Return (launcher name, number of processes it started with our command line), or None.

    Linux only (reads /proc); None when the parent is not a known MPI launcher.
    """
    ppid = os.getppid()
    try:
        parent = _read('/proc/{}/comm'.format(ppid)).strip()
        me = _read('/proc/self/cmdline', 'rb')
        pids = os.listdir('/proc')
    except OSError:
        return None
    if parent not in LAUNCHERS:
        return None
    count = 0
    for pid in pids:
        if not pid.isdigit():
            continue
        try:
            stat = _read('/proc/{}/stat'.format(pid))
            if int(stat.rsplit(')', 1)[1].split()[1]) == ppid and _read(
                    '/proc/{}/cmdline'.format(pid), 'rb') == me:
                count += 1
        except (OSError, ValueError, IndexError):
            continue
    return parent, count


def launcher_of(evidence):
    """Return (family, description) of the launcher that set the variable named in ``evidence``."""
    if evidence.startswith(('OMPI_', 'PMIX_', 'orted', 'prte')):
        return 'openmpi', 'Open MPI (mpirun/prterun)'
    if evidence.startswith('MV2_'):
        return 'mpich', 'MVAPICH (mpirun_rsh)'
    if evidence.startswith(('PMI_', 'MPI_LOCAL', 'hydra', 'mpiexec.hydra')):
        return 'mpich', 'a Hydra/PMI launcher (MPICH, MVAPICH or Intel MPI mpiexec)'
    if evidence.startswith(('SLURM_', 'srun', 'slurmstepd')):
        return 'slurm', 'Slurm srun'
    return 'unknown', evidence


def explain(evidence, lib_family, lib_vendor, own_mpiexec):
    """Return what to do about a singleton launch, given the launcher evidence and mpi4py's MPI."""
    family, who = launcher_of(evidence)
    use = ' (e.g. {})'.format(own_mpiexec) if own_mpiexec else ''
    rebuild = ('or rebuild mpi4py against the MPI whose mpiexec you use: `env MPICC=/path/to/mpicc '
               'pip install --no-binary=mpi4py --force-reinstall mpi4py`')
    if family == 'slurm':
        return ('srun started the processes but MPI did not pick up its PMI: run `srun --mpi=pmix` '
                '(or pmi2, whatever `srun --mpi=list` offers and {} supports), or use the mpiexec '
                'of {}{}; {}'.format(lib_vendor, lib_vendor, use, rebuild))
    if family != lib_family or family == 'unknown':
        return ('the processes were started by {} but mpi4py is linked against {}: the two MPIs '
                'cannot talk, so every process initialises MPI alone as rank 0 of 1 (the manual: '
                '"the mpicc used to build mpi4py and the mpiexec used to run the script are from '
                'different MPI installations"). Run with the mpiexec of {}{}, {}'.format(
                    who, lib_vendor, lib_vendor, use, rebuild))
    return ('the launcher ({}) looks like the same MPI family as mpi4py\'s {}, yet each process '
            'initialised MPI alone: use the mpiexec from the same installation and version{}, make '
            'sure the processes are started by mpiexec itself (a wrapper that drops PMI_FD/PMI_PORT '
            'or copies the environment into new processes breaks the launch), {}'.format(
                who, lib_vendor, use, rebuild))


def diagnose(size, rank, env=None, siblings=None):
    """Return (ok, message, evidence) comparing COMM_WORLD ``size``/``rank`` with the launcher's word.

    ``evidence`` names the launcher variable (or process) that disagrees; None when ok.
    """
    env_size, size_var, local, local_var, env_rank, rank_var = launcher_env(env)
    if size == 1:
        evidence = None
        if env_size is not None and env_size > 1:
            evidence = '{}={}'.format(size_var, env_size)
        elif local is not None and local > 1:
            evidence = '{}={}'.format(local_var, local)
        elif env_rank is not None and env_rank != 0:
            evidence = '{}={}'.format(rank_var, env_rank)
        elif siblings is not None and siblings[1] > 1:
            evidence = '{} started {} copies of this command'.format(*siblings)
        if evidence is not None:
            return False, evidence, (
                'every process is rank 0: the launcher started several processes ({}), but MPI in '
                'this process sees COMM_WORLD size 1, rank 0 -- each process is a separate MPI '
                'singleton and no two can talk to each other'.format(evidence))
        how = 'no launcher' if env_size is None else '{}={}'.format(size_var, env_size)
        return True, None, 'COMM_WORLD size 1 ({})'.format(how)
    if env_size is not None and env_size != size:
        return False, size_var, 'launcher says {}={} but COMM_WORLD size is {}'.format(
            size_var, env_size, size)
    if env_rank is not None and env_rank != rank:
        return False, rank_var, 'launcher says {}={} but COMM_WORLD rank is {}'.format(
            rank_var, env_rank, rank)
    how = 'launcher env not visible' if env_size is None else '{}={}'.format(size_var, env_size)
    return True, None, 'COMM_WORLD size {} matches the launch ({})'.format(size, how)
