"""Read what Slurm told this process about its allocation, step and PMI."""

import os

__all__ = ['allocation', 'pmi_in_use']


def pmi_in_use(env=None):
    """Return which process-management interface started this process.

    'pmi2' (srun --mpi=pmi2: a PMI-1/PMI-2 server on PMI_FD), 'pmix' (srun --mpi=pmix or a
    PMIx launcher), 'hydra' (Hydra's mpiexec), 'none' (srun --mpi=none, or no launcher).
    """
    env = os.environ if env is None else env
    if 'MPI_LOCALNRANKS' in env and 'PMI_FD' in env:
        return 'hydra'
    if any(k.startswith('PMIX_') for k in env):
        return 'pmix'
    if 'PMI_FD' in env:
        return 'pmi2'
    return 'none'


def allocation(env=None):
    """Return a dict describing the Slurm job and step of this process, or None outside Slurm."""
    env = os.environ if env is None else env
    job = env.get('SLURM_JOB_ID') or env.get('SLURM_JOBID')
    if not job:
        return None
    return {
        'job_id': job,
        'step_id': env.get('SLURM_STEP_ID'),
        'in_step': 'SLURM_STEP_ID' in env,
        'nodes': env.get('SLURM_STEP_NODELIST') or env.get('SLURM_JOB_NODELIST') or
        env.get('SLURM_NODELIST'),
        'num_nodes': env.get('SLURM_STEP_NUM_NODES') or env.get('SLURM_JOB_NUM_NODES') or
        env.get('SLURM_NNODES'),
        'tasks_per_node': env.get('SLURM_STEP_TASKS_PER_NODE') or env.get('SLURM_TASKS_PER_NODE'),
        'ntasks': env.get('SLURM_STEP_NUM_TASKS') or env.get('SLURM_NTASKS'),
        'mpi_type': env.get('SLURM_MPI_TYPE'),
        'pmi': pmi_in_use(env),
        'restart_count': env.get('SLURM_RESTART_COUNT'),
        'netmod': env.get('MPIR_CVAR_CH4_NETMOD'),
    }
