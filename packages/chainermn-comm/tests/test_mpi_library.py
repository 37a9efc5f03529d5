"""Without a loadable MPI library, create_communicator says exactly how to get one."""

import subprocess
import sys

from chainermn_comm.install_hints import MPI_INSTALL_HINT

PROBE = '''
import chainermn_comm
try:
    chainermn_comm.create_communicator('naive')
except RuntimeError as e:
    print('ERROR', type(e).__name__, e)
'''


def test_missing_mpi_library_names_the_fix(tmp_path):
    env = {'MPI4PY_LIBMPI': str(tmp_path / 'no-such-libmpi.so'), 'PATH': '/usr/bin:/bin'}
    res = subprocess.run([sys.executable, '-c', PROBE], capture_output=True, text=True, timeout=120,
                         env=env)
    assert res.returncode == 0, res.stderr
    out = res.stdout.strip()
    assert out.startswith('ERROR MPILibraryError mpi4py cannot load an MPI library'), out
    assert MPI_INSTALL_HINT in out, out
    assert '`pip install mpich`' in MPI_INSTALL_HINT
    assert '`pip install "chainermn-comm[mpich]"`' in MPI_INSTALL_HINT
    assert '--no-binary mpi4py mpi4py' in MPI_INSTALL_HINT


def test_mpich_extra_exists():
    """``pip install "chainermn-comm[mpich]"``, which the hint names, brings the MPICH wheel."""
    import importlib.metadata
    meta = importlib.metadata.metadata('chainermn-comm')
    assert 'mpich' in meta.get_all('Provides-Extra'), meta.get_all('Provides-Extra')
    requires = [r.replace(' ', '') for r in meta.get_all('Requires-Dist')]
    assert any(r.startswith('mpich') and 'extra=="mpich"' in r for r in requires), requires
