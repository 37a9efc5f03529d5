"""Communication hooks on the GPU communicators: on the NumPy stand-in for CuPy (every CI run) and,
marked ``gpu``, on a real GPU (one rank per GPU)."""

import os
import re

import pytest

from chainermn_comm.testing import run_pytest_under_mpi

HERE = os.path.dirname(os.path.abspath(__file__))
FAKE = os.path.join(HERE, 'fakecupy')
FILE = os.path.join(HERE, 'mpi', 'mpi_hooks_gpu.py')
ALL = ('naive', 'flat', 'pure_nccl', 'single_node', 'hierarchical', 'two_dimensional', 'non_cuda_aware')
MULTI_NODE = tuple(n for n in ALL if n != 'single_node')


def _env(names, **extra):
    path = os.pathsep.join([FAKE] + [p for p in os.environ.get('PYTHONPATH', '').split(os.pathsep) if p])
    env = {'PYTHONPATH': path, 'CHAINERMN_TEST_GPU_COMMS': ','.join(names),
           'CHAINERMN_CUDA_AWARE': '0', 'CUPY_FAKE_MPI_CUDA_AWARE': '0'}
    env.update({k: str(v) for k, v in extra.items()})
    return env


@pytest.mark.parametrize('n,names,extra', [(1, ALL, {}), (2, ALL, {}), (3, ALL, {}),
                                           (4, MULTI_NODE, {'CHAINERMN_RANKS_PER_NODE': 2})],
                         ids=['1rank', '2ranks', '3ranks', '4ranks-2nodes'])
def test_hooks_on_the_stand_in(n, names, extra):
    res = run_pytest_under_mpi(FILE, n, timeout=240, env=_env(names, **extra))
    counts = [int(m) for m in re.findall(r'(\d+) passed', res.stdout)]
    assert len(counts) == n and min(counts) == 5 * len(names), res.stdout[-3000:]


@pytest.mark.gpu
def test_hooks_on_a_gpu():
    cupy = pytest.importorskip('cupy')
    if getattr(cupy, 'IS_FAKE', False) or cupy.cuda.runtime.getDeviceCount() < 1:
        pytest.skip('needs a GPU')
    run_pytest_under_mpi(FILE, 1, timeout=240, env={'CHAINERMN_TEST_GPU_COMMS': 'pure_nccl,flat'})


def test_hooks_gpu_benchmark_runs_on_the_stand_in():
    """bench/hooks_gpu.py's bookkeeping works end to end (its figures mean nothing on the stand-in)."""
    import json

    from chainermn_comm.testing import run_mpi
    bench = os.path.abspath(os.path.join(HERE, '..', '..', '..', 'bench', 'hooks_gpu.py'))
    if not os.path.isfile(bench):
        pytest.skip('bench/ lives in the monorepo checkout, not in an installed package')
    res = run_mpi([bench, '--iters', '1', '--json'], 1, timeout=240, env=_env(('pure_nccl',)))
    assert res.returncode == 0 and not res.timed_out, res.stdout[-3000:] + res.stderr[-3000:]
    figures = json.loads(res.stdout)
    assert figures['device'] == 'Fake GPU (NumPy)' and figures['arrays'] == 162
    assert figures['compressed'] == 54 and figures['compress_decompress_ms'] > 0
    assert sorted(figures['parts_ms']) == ['powersgd compress', 'powersgd decompress', 'powersgd orthogonalize']
