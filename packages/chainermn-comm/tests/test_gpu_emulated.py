"""Run the GPU communicator tests on the CPU, with tests/fakecupy standing in for CuPy and NCCL.

The `gpu` tests need a GPU; these run the same test bodies (mpi/mpi_gpu.py, test_gpu_packer.py)
against a NumPy stand-in (see fakecupy/README.md), so every GPU communicator's own code runs in
CI: packing plans, two-level and 2-D reductions, host staging and CUDA-aware branches, device
send/recv, and the error paths.  Kernels compiling and running is left to the `gpu` tests.
"""

import os
import re
import subprocess
import sys

import pytest

from chainermn_comm.testing import run_mpi, run_pytest_under_mpi

HERE = os.path.dirname(os.path.abspath(__file__))
FAKE = os.path.join(HERE, 'fakecupy')
ALL = ('naive', 'flat', 'pure_nccl', 'single_node', 'hierarchical', 'two_dimensional', 'non_cuda_aware')
MULTI_NODE = tuple(n for n in ALL if n != 'single_node')
#: What runs with two ranks on one GPU (every rank its own simulated node): no NCCL group of two.
SHARED_GPU = ('naive', 'flat', 'hierarchical', 'two_dimensional', 'non_cuda_aware')


def _env(names=ALL, cuda_aware=False, **extra):
    path = os.pathsep.join([FAKE] + [p for p in os.environ.get('PYTHONPATH', '').split(os.pathsep) if p])
    env = {'PYTHONPATH': path, 'CHAINERMN_TEST_GPU_COMMS': ','.join(names),
           'CHAINERMN_CUDA_AWARE': '1' if cuda_aware else '0',
           'CUPY_FAKE_MPI_CUDA_AWARE': '1' if cuda_aware else '0'}
    env.update({k: str(v) for k, v in extra.items()})
    return env


@pytest.mark.parametrize('n,names,cuda_aware,extra', [
    (1, ALL, False, {}),
    (1, ALL, True, {}),
    (2, ALL, False, {}),
    (2, ALL, True, {}),
    (3, ALL, False, {}),
    (4, MULTI_NODE, False, {'CHAINERMN_RANKS_PER_NODE': 2}),
    (4, MULTI_NODE, True, {'CHAINERMN_RANKS_PER_NODE': 2}),
    (2, SHARED_GPU, False, {'CHAINERMN_RANKS_PER_NODE': 1, 'CUPY_FAKE_DEVICES': 1}),
], ids=['1rank', '1rank-cuda-aware', '2ranks', '2ranks-cuda-aware', '3ranks', '4ranks-2nodes',
        '4ranks-2nodes-cuda-aware', '2ranks-1gpu'])
def test_gpu_communicators_on_the_stand_in(n, names, cuda_aware, extra):
    res = run_pytest_under_mpi(os.path.join(HERE, 'mpi', 'mpi_gpu.py'), n, timeout=240,
                               env=_env(names, cuda_aware, **extra))
    # The stand-in really ran the tests (without it, importorskip would skip them all): 22 per
    # communicator, of which at most 2 skip (send/recv at 1 rank, wrong device with 1 device).
    counts = [int(m) for m in re.findall(r'(\d+) passed', res.stdout)]
    assert len(counts) == n and min(counts) >= 20 * len(names), res.stdout[-3000:]


def test_error_paths_on_the_stand_in():
    run_pytest_under_mpi(os.path.join(HERE, 'mpi', 'mpi_gpu_emulated_errors.py'), 2, timeout=120,
                         env=_env(CHAINERMN_RANKS_PER_NODE=1, CUPY_FAKE_DEVICES=1),
                         extra_args=['-k', 'not two_ranks_on_one_gpu'])
    run_pytest_under_mpi(os.path.join(HERE, 'mpi', 'mpi_gpu_emulated_errors.py'), 2, timeout=120,
                         env=_env(CUPY_FAKE_DEVICES=1), extra_args=['-k', 'stand_in or two_ranks_on_one_gpu'])


def test_gradient_packer_on_the_stand_in():
    env = dict(os.environ, **_env())
    res = subprocess.run([sys.executable, '-m', 'pytest', '-q', '-p', 'no:cacheprovider',
                          os.path.join(HERE, 'test_gpu_packer.py'), '-k', 'not wait'],
                         env=env, capture_output=True, text=True, timeout=240)
    assert res.returncode == 0, res.stdout + res.stderr
    assert '20 passed' in res.stdout, res.stdout


def test_stand_in_refuses_what_cupy_refuses():
    code = r'''
import numpy, cupy
a = cupy.arange(4, dtype=numpy.float32)
for bad in (lambda: numpy.asarray(a), lambda: a + numpy.ones(4), lambda: a.__setitem__(slice(None), numpy.ones(4)),
            lambda: numpy.ones(4).__setitem__(slice(None), a), lambda: a.set(numpy.ones(3, numpy.float32)),
            lambda: a.__cuda_array_interface__):
    try:
        bad()
    except (TypeError, ValueError, AttributeError):
        continue
    raise SystemExit('not refused')
assert isinstance(a.max(), cupy.ndarray) and float(a.max()) == 3.0
assert not isinstance(a, numpy.ndarray) and a.device.id == 0
with cupy.cuda.Device(3):
    assert cupy.zeros(2).device.id == 3 and a[1:].device.id == 0
print('ok')
'''
    env = dict(os.environ, **_env())
    res = subprocess.run([sys.executable, '-c', code], env=env, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and res.stdout.strip() == 'ok', res.stdout + res.stderr


def test_gpu_benchmark_runs_on_the_stand_in():
    """The GPU benchmark's bookkeeping works end to end (its figures mean nothing on the stand-in)."""
    import json
    bench = os.path.abspath(os.path.join(os.path.dirname(__file__), '..', '..', '..', 'bench', 'bench_gpu.py'))
    if not os.path.isfile(bench):
        pytest.skip('bench/ lives in the monorepo checkout, not in an installed package')
    res = run_mpi([bench, '--comm', 'pure_nccl', '--iters', '1', '--json'],
                  1, timeout=240, env=_env())
    assert res.returncode == 0 and not res.timed_out, res.stdout[-3000:] + res.stderr[-3000:]
    figures = json.loads(res.stdout)
    assert figures['device'] == 'Fake GPU (NumPy)' and figures['arrays'] == 161
    assert figures['elements'] == 25557032
    for key in ('batched_float32', 'batched_float16', 'per_array_float32'):
        assert figures[key]['pack_ms'] > 0 and figures[key]['unpack_GBps'] > 0
    assert figures['fp16_over_fp32_time'] > 0 and figures['d2d_copy_GBps'] > 0


def test_nccl_calls_are_watched_not_waited_for_on_the_stand_in():
    """test_nccl_watch.py's NcclGroup case, run where the stand-in is importable as cupy."""
    env = dict(os.environ, **_env())
    res = subprocess.run([sys.executable, '-m', 'pytest', '-q', '-p', 'no:cacheprovider',
                          os.path.join(HERE, 'test_nccl_watch.py'), '-k', 'nccl_group'],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120)
    out = res.stdout.decode(errors='replace')
    assert res.returncode == 0, out
    assert re.search(r'\b1 passed\b', out), out
