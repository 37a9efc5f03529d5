"""chainermn-comm installs on its own into a fresh CPU-only venv and its own tests pass there.

Slow-ish (one to a few minutes with a warm pip cache) but not marked ``slow``: CI must run it.
"""

import os
import shutil
import subprocess
import sys

import pytest

PKG = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS = os.path.join(PKG, 'tests')


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
    # test_bench_smoke drives the monorepo's bench/ scripts, which are not part of the package.
    out = _run([py, '-m', 'pytest', '-q', '-p', 'no:cacheprovider', '--timeout', '900',
                '-m', 'not slow and not gpu', '-k', 'not standalone',
                '--ignore', str(tests / 'test_bench_smoke.py'), str(tests)], env, cwd, 1200)
    assert ' passed' in out and 'failed' not in out, out[-5000:]
