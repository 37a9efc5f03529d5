"""The doctor's Slurm rows from a given environment (no cluster needed)."""

from chainermn_tools.doctor._slurm import slurm_rows
from chainermn_tools.slurm import allocation, pmi_in_use

MPICH = {'family': 'mpich', 'vendor': 'MPICH'}
OPENMPI = {'family': 'openmpi', 'vendor': 'Open MPI'}
STEP = {'SLURM_JOB_ID': '42', 'SLURM_STEP_ID': '0', 'SLURM_STEP_NODELIST': 'node[1-2]',
        'SLURM_STEP_NUM_NODES': '2', 'SLURM_STEP_TASKS_PER_NODE': '2(x2)',
        'SLURM_STEP_NUM_TASKS': '4', 'SLURM_MPI_TYPE': 'pmi2', 'PMI_FD': '11', 'PMI_RANK': '0'}
HOSTS = {'node1': [0, 1], 'node2': [2, 3]}


def _rows(env, lib=MPICH, size=4):
    return {r.check: r for r in slurm_rows(lib, size, HOSTS, env=env)}


def test_outside_slurm_no_rows():
    assert slurm_rows(MPICH, 1, {'vm': [0]}, env={}) == []
    assert allocation({}) is None


def test_allocation_row():
    row = _rows(dict(STEP, SLURM_RESTART_COUNT='1'))['slurm allocation']
    assert row.status == 'INFO'
    for part in ('job 42 step 0', '2 node(s) node[1-2]', 'tasks per node 2(x2)', '4 task(s)',
                 'node1 x2, node2 x2', 'PMI-2 server of srun --mpi=pmi2', 'restarted 1 time(s)'):
        assert part in row.detail, row.detail


def test_pmi2_mpich_ofi_ok_and_ucx_warns():
    ok = _rows(dict(STEP, MPIR_CVAR_CH4_NETMOD='ofi'))['slurm launcher']
    assert ok.status == 'OK' and 'OFI' in ok.detail
    warn = _rows(dict(STEP))['slurm launcher']
    assert warn.status == 'WARN'
    assert 'value not properly terminated' in warn.detail
    assert 'MPIR_CVAR_CH4_NETMOD=ofi' in warn.fix


def test_srun_without_pmi_fails_with_the_flag_to_add():
    env = {k: v for k, v in STEP.items() if k not in ('PMI_FD', 'PMI_RANK')}
    env['SLURM_MPI_TYPE'] = 'none'
    row = _rows(env, size=1)['slurm launcher']
    assert row.status == 'FAIL' and '--mpi=pmi2' in row.fix
    assert '--mpi=pmix' in _rows(env, lib=OPENMPI, size=1)['slurm launcher'].fix


def test_pmi_in_use():
    assert pmi_in_use({'PMI_FD': '3', 'MPI_LOCALNRANKS': '2'}) == 'hydra'
    assert pmi_in_use({'PMIX_RANK': '0'}) == 'pmix'
    assert pmi_in_use({'PMI_FD': '3'}) == 'pmi2'
    assert pmi_in_use({}) == 'none'
    row = _rows({'SLURM_JOB_ID': '7', 'SLURM_JOB_NODELIST': 'node1'}, size=1)['slurm allocation']
    assert 'no job step' in row.detail
