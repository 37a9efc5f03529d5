"""The doctor's Slurm rows: the allocation, and launcher/MPI combinations known to fail."""

from chainermn_tools.doctor._report import FAIL, INFO, OK, WARN, Row
from chainermn_tools.slurm._env import allocation

__all__ = ['slurm_rows', 'PMI2_UCX_FIX']

PMI2_UCX_FIX = (
    'export MPIR_CVAR_CH4_NETMOD=ofi before the job starts (chainermn sets it itself when it is '
    'imported before mpi4py.MPI with the mpich wheel; see docs/cluster.md, section "Slurm"), or launch '
    'with `srun --mpi=pmix` if your MPICH was built with PMIx, or with the MPI\'s own mpiexec '
    'inside the allocation')


def _allocation_row(a, size, hosts):
    layout = ', '.join('{} x{}'.format(h, len(r)) for h, r in hosts.items())
    how = {'pmi2': 'PMI-2 server of srun --mpi=pmi2 (PMI_FD)',
           'pmix': 'PMIx (srun --mpi=pmix or a PMIx launcher)',
           'hydra': "Hydra's mpiexec inside the allocation",
           'none': 'none (srun --mpi=none or no launcher)'}[a['pmi']]
    detail = 'job {} {}: {} node(s) {}, tasks per node {}, {} task(s); ranks here: {} ({}); ' \
             'PMI: {}'.format(a['job_id'], 'step {}'.format(a['step_id']) if a['in_step'] else
                              '(no job step: salloc/sbatch shell)', a['num_nodes'] or '?',
                              a['nodes'] or '?', a['tasks_per_node'] or '?', a['ntasks'] or '?',
                              size, layout, how)
    if a['mpi_type']:
        detail += ', SLURM_MPI_TYPE={}'.format(a['mpi_type'])
    if a['restart_count']:
        detail += ', restarted {} time(s) (SLURM_RESTART_COUNT)'.format(a['restart_count'])
    return Row('slurm allocation', INFO, detail)


def slurm_rows(lib, size, hosts, env=None):
    """Return the Slurm rows (none outside a Slurm job). ``hosts``: {host: [ranks]}."""
    a = allocation(env)
    if a is None:
        return []
    rows = [_allocation_row(a, size, hosts)]
    try:
        ntasks = int(a['ntasks'] or 0)
    except ValueError:
        ntasks = 0
    if a['in_step'] and a['pmi'] == 'none' and ntasks > 1 and size == 1:
        want = 'pmix' if lib['family'] == 'openmpi' else 'pmi2'
        rows.append(Row('slurm launcher', FAIL, 'srun started {} tasks without a PMI, so each is an '
                        'MPI singleton'.format(ntasks),
                        'run `srun --mpi={} ...` (or set MpiDefault={} in slurm.conf, or export '
                        'SLURM_MPI_TYPE={})'.format(want, want, want)))
    elif a['pmi'] == 'pmi2' and lib['family'] == 'openmpi':
        rows.append(Row('slurm launcher', WARN, 'Open MPI under srun --mpi=pmi2',
                        'Open MPI 5 talks PMIx only: run `srun --mpi=pmix`'))
    elif a['pmi'] == 'pmi2' and lib['vendor'] == 'MPICH':
        if (a['netmod'] or '').lower() == 'ofi':
            rows.append(Row('slurm launcher', OK, 'MPICH under srun --mpi=pmi2 with the OFI netmod '
                            '(MPIR_CVAR_CH4_NETMOD=ofi): its PMI-1 lines stay under Slurm\'s '
                            '1024-byte limit. chainermn sets it when imported before mpi4py.MPI; a '
                            'script that imports mpi4py.MPI first must export it itself'))
        else:
            rows.append(Row('slurm launcher', WARN, 'MPICH under srun --mpi=pmi2 with the {} '
                            'netmod: Slurm reads PMI-1 requests in 1024-byte pieces and UCX\'s '
                            'address lines can be longer, so MPI_Init hangs when it runs after '
                            'large imports (slurmstepd: "mpi/pmi2: value not properly terminated '
                            'in client request")'.format(a['netmod'] or 'default (UCX)'),
                            PMI2_UCX_FIX))
    return rows
