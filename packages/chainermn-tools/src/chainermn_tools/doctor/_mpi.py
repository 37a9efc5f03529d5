"""Identify the MPI library mpi4py is linked against and the mpiexec on PATH, and compare them."""

import os
import re
import shutil
import subprocess
import sys

__all__ = ['library_family', 'launcher_family', 'library_info', 'find_mpiexec', 'mpiexec_info',
           'compare']

MPICH_FAMILY = 'MPICH family (MPICH, MVAPICH, Intel MPI; Hydra/PMI launcher)'
OPENMPI_FAMILY = 'Open MPI'


def library_family(text):
    """Return (family, vendor name) from MPI_Get_library_version text."""
    t = text.lower()
    if 'open mpi' in t:
        return 'openmpi', 'Open MPI'
    if 'mvapich' in t:
        return 'mpich', 'MVAPICH'
    if 'intel(r) mpi' in t or 'intel mpi' in t:
        return 'mpich', 'Intel MPI'
    if 'mpich' in t:
        return 'mpich', 'MPICH'
    return 'unknown', (text.strip().splitlines() or ['unknown'])[0]


def launcher_family(text):
    """Return (family, description) from ``mpiexec --version`` output."""
    t = text.lower()
    if 'intel(r) mpi' in t:
        return 'mpich', 'Intel MPI (Hydra)'
    if 'hydra' in t:
        return 'mpich', 'Hydra (MPICH/MVAPICH)'
    if 'openrte' in t or 'open mpi' in t or 'open-mpi' in t or 'prrte' in t:
        return 'openmpi', 'Open MPI (OpenRTE/PRRTE)'
    if 'slurm' in t:
        return 'slurm', 'Slurm srun'
    return 'unknown', (text.strip().splitlines() or ['unknown'])[0]


def _version_in(text):
    m = re.search(r'[Vv]ersion:?\s*([0-9]+(?:\.[0-9]+)+)', text) or re.search(
        r'\b([0-9]+\.[0-9]+(?:\.[0-9]+)?)\b', text)
    return m.group(1) if m else None


def library_info(MPI):
    """Return a dict describing the MPI library this process runs (mpi4py's link)."""
    import mpi4py
    text = MPI.Get_library_version()
    family, vendor = library_family(text)
    return {'mpi4py': mpi4py.__version__, 'family': family, 'vendor': vendor,
            'version': _version_in(text), 'standard': '{}.{}'.format(*MPI.Get_version()),
            'first_line': (text.strip().splitlines() or [''])[0].strip()}


def find_mpiexec():
    """Return (mpiexec on PATH or None, mpiexec next to this Python or None)."""
    beside = os.path.join(os.path.dirname(sys.executable), 'mpiexec')
    return shutil.which('mpiexec'), (beside if os.access(beside, os.X_OK) else None)


def mpiexec_info(path, timeout=20):
    """Run ``path --version``; return a dict with family, description, version, or an error."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(('PMI_', 'PMIX_', 'OMPI_', 'HYDRA_', 'MPI_LOCAL'))}
    try:
        proc = subprocess.run([path, '--version'], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              stdin=subprocess.DEVNULL, timeout=timeout, env=env)
    except (OSError, subprocess.TimeoutExpired) as e:
        return {'path': path, 'error': '{}: {}'.format(type(e).__name__, e)}
    text = proc.stdout.decode(errors='replace')
    family, desc = launcher_family(text)
    return {'path': path, 'family': family, 'description': desc, 'version': _version_in(text),
            'first_line': (text.strip().splitlines() or [''])[0].strip()}


def compare(lib, launcher):
    """Return (status, detail, fix) for the library/launcher pairing."""
    from chainermn_tools.doctor._report import FAIL, OK, WARN
    if launcher is None:
        return WARN, 'no mpiexec on PATH', ('put the bin directory of the MPI that mpi4py is linked '
                                            'against ({}) first on PATH'.format(lib['vendor']))
    if 'error' in launcher:
        return FAIL, '{} --version failed: {}'.format(launcher['path'], launcher['error']), (
            'check that {} is a working MPI launcher'.format(launcher['path']))
    detail = '{} {} at {}'.format(launcher['description'], launcher['version'] or '?',
                                  launcher['path'])
    if 'unknown' in (lib['family'], launcher['family']) or launcher['family'] == 'slurm':
        return WARN, detail + '; cannot tell whether it matches ' + lib['vendor'], (
            'make sure this launcher belongs to the MPI mpi4py is linked against ({}); a mismatch '
            'makes every process rank 0'.format(lib['vendor']))
    if lib['family'] != launcher['family']:
        return FAIL, detail + ' does NOT match the library mpi4py uses ({} {})'.format(
            lib['vendor'], lib['version'] or ''), (
            'use the mpiexec of the MPI that mpi4py is linked against ({}), e.g. put its bin '
            'directory first on PATH; or rebuild mpi4py against the MPI you want: '
            '`env MPICC=/path/to/mpicc pip install --no-binary=mpi4py --force-reinstall mpi4py`'
            .format(lib['vendor']))
    if lib['version'] and launcher['version'] and lib['version'] != launcher['version'] \
            and lib['vendor'] == 'MPICH':
        return WARN, detail + ' (library is {} {})'.format(lib['vendor'], lib['version']), (
            'same MPI family but a different version: prefer the mpiexec installed with the library')
    return OK, detail + ' matches {}'.format(lib['vendor']), ''
