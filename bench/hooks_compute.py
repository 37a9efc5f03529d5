"""PowerSGD's compute on the host: compress, orthogonalise and decompress the ResNet-50 gradient set.

One process, ``--threads`` BLAS threads (1), no network: a one-rank stand-in communicator
whose average does nothing, so what is timed is the hook's own arithmetic (every update
compressed, error feedback and warm start on), with the host products PowerSGD picks (compiled by
Numba where installed) and with NumPy's (``CHAINERMN_POWERSGD_JIT=0``).  ``--baseline REV`` also times PowerSGD as
committed at git revision REV (its ``powersgd.py`` and ``lowrank.py`` loaded from ``git
show``), the two interleaved, the same
gradients copied in before every call (not timed).  Prints per contender the wall and CPU time
(median and minimum over ``--rounds``) and writes them to ``--out`` (JSON) when given.

  python bench/hooks_compute.py --baseline c4bceca --rounds 15
"""

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy
from threadpoolctl import threadpool_limits

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import models  # noqa: E402

HOOKS = 'packages/chainermn-comm/src/chainermn_comm/hooks/'


class OneRank:
    """A communicator of one rank: averaging changes nothing."""

    size = 1

    def _mean_arrays(self, arrays, wire):
        pass


def baseline_class(rev, workdir):
    """Return the ``PowerSGD`` class of git revision ``rev`` (its low-rank module loaded beside it)."""
    root = subprocess.check_output(['git', 'rev-parse', '--show-toplevel'], text=True).strip()
    mods = {}
    for name in ('lowrank', 'powersgd'):
        src = subprocess.check_output(['git', '-C', root, 'show', '{}:{}{}.py'.format(rev, HOOKS, name)],
                                      text=True)
        src = src.replace('from chainermn_comm.hooks import lowrank\n',
                          'import baseline_lowrank as lowrank\n')
        path = os.path.join(workdir, 'baseline_{}.py'.format(name))
        with open(path, 'w') as f:
            f.write(src)
        spec = importlib.util.spec_from_file_location('baseline_' + name, path)
        mods[name] = importlib.util.module_from_spec(spec)
        sys.modules['baseline_' + name] = mods[name]
        spec.loader.exec_module(mods[name])
    return mods['powersgd'].PowerSGD


def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--baseline', default=None, help='git revision whose PowerSGD to time alongside')
    p.add_argument('--rank', type=int, default=4)
    p.add_argument('--rounds', type=int, default=15)
    p.add_argument('--threads', type=int, default=1, help='BLAS threads')
    p.add_argument('--out', default=None)
    args = p.parse_args()
    from chainermn_comm.hooks import GradBucket, PowerSGD
    shapes = models.param_shapes('resnet50', 'full')
    rng = numpy.random.RandomState(0)
    grads0 = [rng.standard_normal(s).astype(numpy.float32) for _, s in shapes]
    names = [n for n, _ in shapes]
    comm = OneRank()
    with tempfile.TemporaryDirectory() as tmp:
        classes = {'current': PowerSGD, 'current, NumPy': PowerSGD}
        if args.baseline:
            classes['baseline ' + args.baseline] = baseline_class(args.baseline, tmp)
        contenders = {k: (c(rank=args.rank, start_update=0), [g.copy() for g in grads0])
                      for k, c in classes.items()}
        first = {}
        wall = {k: [] for k in contenders}
        cpu = {k: [] for k in contenders}
        with threadpool_limits(args.threads):
            for r in range(args.rounds + 1):  # round 0: first calls (plans, buffers), not counted
                order = sorted(contenders) if r % 2 else sorted(contenders, reverse=True)
                for k in order:
                    hook, grads = contenders[k]
                    for g, g0 in zip(grads, grads0):
                        g[...] = g0
                    t0, c0 = time.perf_counter(), time.process_time()
                    if k == 'current, NumPy':  # read when the hook plans its first call
                        os.environ['CHAINERMN_POWERSGD_JIT'] = '0'
                    hook(comm, GradBucket(grads, names))
                    os.environ.pop('CHAINERMN_POWERSGD_JIT', None)
                    if not r:
                        first[k] = time.perf_counter() - t0
                    if r:
                        cpu[k].append(time.process_time() - c0)
                        wall[k].append(time.perf_counter() - t0)
    values = sum(g.size for g in grads0)
    compressed = contenders['current'][0].last['compressed']
    load = ', '.join('%.1f' % v for v in os.getloadavg())
    print('PowerSGD rank {} compute on the ResNet-50 set ({:.1f} M values, {} compressed), {} BLAS '
          'thread(s), {} rounds; load average {}'.format(args.rank, values / 1e6, compressed, args.threads,
                                                         args.rounds, load))
    result = {}
    for k in sorted(contenders):
        result[k] = {'wall_median_ms': statistics.median(wall[k]) * 1e3, 'wall_min_ms': min(wall[k]) * 1e3,
                     'cpu_median_ms': statistics.median(cpu[k]) * 1e3, 'cpu_min_ms': min(cpu[k]) * 1e3,
                     'first_call_ms': first[k] * 1e3,
                     'products': getattr(contenders[k][0], 'host_products', {}).get('<f4', 'numpy')}
        print('  {:<22s} wall median {wall_median_ms:6.1f} ms  min {wall_min_ms:6.1f} ms   CPU median '
              '{cpu_median_ms:6.1f} ms  min {cpu_min_ms:6.1f} ms  first call {first_call_ms:6.0f} ms '
              '({products})'.format(k, **result[k]))
    if args.out:
        with open(args.out, 'w') as f:
            json.dump({'rank': args.rank, 'threads': args.threads, 'rounds': args.rounds,
                       'values': int(values), 'load_average': os.getloadavg(), 'results': result}, f,
                      indent=1)


if __name__ == '__main__':
    main()
