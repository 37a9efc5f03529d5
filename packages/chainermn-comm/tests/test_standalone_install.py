"""chainermn-comm installs on its own into a fresh CPU-only venv and its own tests pass there.

Slow-ish (about a minute with a warm pip cache) but not marked ``slow``: CI must run it.
"""

import os
import shutil
import subprocess
import sys

import pytest

PKG = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS = os.path.join(PKG, 'tests')
#: The package's tests run in the standalone venv: every unit test file and a multi-process sample
#: (the communicator API, object calls, the guard's voice) at 1-3 ranks.
STANDALONE_FILES = ['test_codecs.py', 'test_departure.py', 'test_global_except_hook.py', 'test_gpu_packer.py',
                    'test_gpu_unit.py', 'test_guard.py', 'test_half_scale.py', 'test_hooks_unit.py',
                    'test_log.py', 'test_mpi_library.py', 'test_nccl_watch.py', 'test_objects.py',
                    'test_safe_files.py', 'test_settings.py', 'test_slurm_pmi.py', 'test_spelling.py',
                    'test_stream_pacer.py', 'test_trace.py', 'test_voice.py', 'test_recv_obj_mpi.py',
                    'test_voice_mpi.py', 'test_grad_engine.py']


def _run(cmd, env, cwd, timeout):
    proc = subprocess.run(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          timeout=timeout, stdin=subprocess.DEVNULL)
    out = proc.stdout.decode(errors='replace')
    assert proc.returncode == 0, '{} -> status {}\n{}'.format(' '.join(map(str, cmd)), proc.returncode,
                                                              out[-20000:])
    return out


@pytest.mark.skipif(sys.version_info >= (3, 13),
                    reason='builds the NumPy 1.26 stack (setuptools<74, numpy<2), which has no wheels '
                           'for Python 3.13+; building NumPy from source is not a test')
@pytest.mark.timeout(1500)
def test_standalone_install_and_own_tests(tmp_path):
    venv = tmp_path / 'venv'
    subprocess.run([sys.executable, '-m', 'venv', str(venv)], check=True, timeout=300)
    bindir = venv / 'bin'
    py = str(bindir / 'python')
    env = {k: v for k, v in os.environ.items()
           if k not in ('PYTHONPATH', 'VIRTUAL_ENV', 'PYTHONHOME') and not k.startswith('CHAINERMN_')}
    outer_bin = os.path.dirname(sys.executable)
    path = [p for p in env.get('PATH', '').split(os.pathsep) if p and os.path.abspath(p) != outer_bin]
    env['PATH'] = os.pathsep.join([str(bindir)] + path)
    env['VIRTUAL_ENV'] = str(venv)
    env['PIP_DISABLE_PIP_VERSION_CHECK'] = '1'
    pip = [py, '-m', 'pip', 'install', '-q']
    cwd = str(tmp_path)
    _run(pip + ['setuptools<74', 'numpy>=1.26,<2', 'wheel'], env, cwd, 600)
    _run(pip + ['--no-build-isolation', 'chainer==7.8.1'], env, cwd, 900)
    _run(pip + ['mpi4py', 'mpich', 'pytest', 'pytest-timeout'], env, cwd, 900)
    _run(pip + [PKG], env, cwd, 900)  # a plain (non-editable) install from the package folder

    where = _run([py, '-c', 'import chainermn_comm, mpi4py; print(chainermn_comm.__file__)'],
                 env, cwd, 120).strip().splitlines()[-1]
    assert where.startswith(str(venv)), where
    assert os.path.exists(str(bindir / 'mpiexec'))

    # The package's own tests, copied out of the repo so nothing resolves to the source tree.
    tests = tmp_path / 'tests'
    shutil.copytree(TESTS, str(tests), ignore=shutil.ignore_patterns('__pycache__'))
    # Its unit tests and a sample of its multi-process tests: the whole set runs from the checkout in
    # the same suite (rerunning all of it here doubled the CI's time for this package).
    out = _run([py, '-m', 'pytest', '-q', '-p', 'no:cacheprovider', '--timeout', '900',
                '-m', 'not slow and not gpu'] + [str(tests / f) for f in STANDALONE_FILES], env, cwd, 1200)
    assert ' passed' in out and 'failed' not in out, out[-5000:]
