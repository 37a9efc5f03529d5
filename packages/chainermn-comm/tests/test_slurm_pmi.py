"""The srun --mpi=pmi2 workaround: when it selects MPICH's OFI netmod and when it stays away."""

import os
import subprocess
import sys

import pytest

from chainermn_comm import _slurm_pmi

SRUN = {'PMI_FD': '11', 'PMI_JOBID': '7.0', 'PMI_RANK': '0', 'PMI_SIZE': '2',
        'SLURM_JOB_ID': '7', 'SLURM_STEP_ID': '0', 'SLURM_MPI_TYPE': 'pmi2'}


def _decide(env, **kw):
    kw.setdefault('mpi_initialized', False)
    kw.setdefault('have_wheel', True)
    return _slurm_pmi.decide(env, **kw)


def test_applies_under_srun_pmi2_with_the_wheel():
    applied, reason = _decide(dict(SRUN))
    assert applied
    assert 'MPIR_CVAR_CH4_NETMOD=ofi' in reason


def test_apply_sets_the_cvar_in_the_given_env():
    env = dict(SRUN)
    assert _slurm_pmi.apply(env)[0] == (_slurm_pmi.mpich_wheel_installed()
                                        and 'mpi4py.MPI' not in sys.modules)
    if env.get('MPIR_CVAR_CH4_NETMOD'):
        assert env['MPIR_CVAR_CH4_NETMOD'] == 'ofi'


@pytest.mark.parametrize('change, why', [
    ({'PMI_FD': None}, 'not started by srun'),
    ({'SLURM_STEP_ID': None}, 'not started by srun'),                   # mpiexec inside salloc
    ({'MPI_LOCALNRANKS': '2'}, 'not started by srun'),                  # Hydra's ranks
    ({'SLURM_MPI_TYPE': 'pmix'}, 'not started by srun'),
    ({'CHAINERMN_SLURM_PMI_FIX': '0'}, 'CHAINERMN_SLURM_PMI_FIX=0'),
    ({'MPIR_CVAR_CH4_NETMOD': 'ucx'}, 'MPIR_CVAR_CH4_NETMOD=ucx set by the user'),
])
def test_stays_away(change, why):
    env = dict(SRUN)
    for k, v in change.items():
        if v is None:
            del env[k]
        else:
            env[k] = v
    applied, reason = _decide(env)
    assert not applied
    assert why in reason


def test_too_late_once_mpi_is_initialised():
    applied, reason = _decide(dict(SRUN), mpi_initialized=True)
    assert not applied and 'before chainermn' in reason


def test_only_for_the_mpich_wheel():
    applied, reason = _decide(dict(SRUN), have_wheel=False)
    assert not applied and 'not the mpich wheel' in reason


def test_import_applies_it_before_mpi_init():
    """A fresh interpreter that looks like an srun task gets the CVAR when chainermn_comm loads."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(('PMI_', 'SLURM_', 'MPI_LOCAL', 'MPIR_CVAR_CH4_NETMOD'))}
    env.update(SRUN)
    env['PMI_FD'] = '999'   # never touched: MPI is not initialised by the import
    code = ('import os, sys, chainermn_comm; from chainermn_comm import _slurm_pmi; '
            'print(os.environ.get("MPIR_CVAR_CH4_NETMOD"), "mpi4py.MPI" in sys.modules, '
            '_slurm_pmi.state()[0])')
    out = subprocess.run([sys.executable, '-c', code], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, timeout=120, check=True).stdout.decode().split()
    if not _slurm_pmi.mpich_wheel_installed():
        assert out == ['None', 'False', 'False']
    else:
        assert out == ['ofi', 'False', 'True']
