"""The README's Quick start under different thread settings, interleaved: what sizing the pools gains.

Usage (from the repo root):
    .venv/bin/python bench/quickstart_threads.py [--ranks 2,3] [--reps 5] [--epoch 10]
        [--python VENV/bin/python] [--out FILE.json]

The ``quickstart`` block of README.md is written to a temporary ``train.py`` and run as
``mpiexec -n N PYTHON train.py --epoch E --out DIR`` (a fresh ``DIR`` each run: no resume), with
the environment of each contender, in an order that changes with every repetition:

- ``default``: nothing set (chainermn sizes each rank's BLAS and OpenMP pools);
- ``CHAINERMN_THREADS=0``: the pools left as the libraries start them (the default before);
- ``OMP_NUM_THREADS=K`` for K in ``--omp`` (default 1 and the CPUs of this machine).

A run's time is the training time of its last LogReport entry (``elapsed_time``), as the issue
measured it.  ``--python`` picks the venv (e.g. one made with the README's install block: its
``mpiexec`` next to it is used).  Printed: each contender's times and median, and the default's
ratio to the best ``OMP_NUM_THREADS`` median and to ``CHAINERMN_THREADS=0`` (medians, and the
median of per-repetition ratios).
"""

import argparse
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import report  # noqa: E402

__all__ = ['main', 'quickstart_source']

_CLEAR = ('OMP_NUM_THREADS', 'OPENBLAS_NUM_THREADS', 'MKL_NUM_THREADS', 'CHAINERMN_THREADS',
          'CHAINERMN_THREADS_CHOSEN')


def quickstart_source():
    """Return the code of README.md's ``quickstart`` block."""
    with open(os.path.join(ROOT, 'README.md')) as f:
        text = f.read()
    m = re.search(r'<!-- runnable: quickstart -->\s*```python\n(.*?)```', text, re.S)
    if m is None:
        raise SystemExit('README.md has no quickstart block')
    return m.group(1)


def _run(mpiexec, python, script, n, epoch, env, work):
    out = tempfile.mkdtemp(prefix='run-', dir=work)
    res = subprocess.run([mpiexec, '-n', str(n), python, script, '--epoch', str(epoch), '--out', out],
                         cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=1800)
    if res.returncode != 0:
        raise SystemExit('quickstart failed ({}):\n{}\n{}'.format(res.returncode, res.stdout[-3000:],
                                                                  res.stderr[-3000:]))
    with open(os.path.join(out, 'log')) as f:
        seconds = json.load(f)[-1]['elapsed_time']
    shutil.rmtree(out, ignore_errors=True)
    return seconds


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--ranks', default='2,3')
    p.add_argument('--reps', type=int, default=5)
    p.add_argument('--epoch', type=int, default=10)
    p.add_argument('--omp', default=None, help='OMP_NUM_THREADS values (default: 1 and the CPU count)')
    p.add_argument('--python', default=sys.executable)
    p.add_argument('--out', default=None)
    args = p.parse_args(argv)
    cpus = len(os.sched_getaffinity(0))
    omp = sorted({int(v) for v in (args.omp or '1,{}'.format(cpus)).split(',')})
    mpiexec = os.path.join(os.path.dirname(args.python), 'mpiexec')
    base = {k: v for k, v in os.environ.items() if k not in _CLEAR}
    base.update(PYTHONUNBUFFERED='1', CHAINERMN_TIMEOUT='600')
    contenders = {'default': {}, 'CHAINERMN_THREADS=0': {'CHAINERMN_THREADS': '0'}}
    contenders.update({'OMP_NUM_THREADS={}'.format(k): {'OMP_NUM_THREADS': str(k)} for k in omp})
    work = tempfile.mkdtemp(prefix='chainermn-qs-threads-')
    result = {'meta': {'command': ' '.join(sys.argv), 'python': args.python, 'cpus': cpus,
                       'loadavg_before': os.getloadavg()}, 'ranks': {}}
    try:
        script = os.path.join(work, 'train.py')
        with open(script, 'w') as f:
            f.write(quickstart_source())
        for n in [int(v) for v in args.ranks.split(',')]:
            times = {c: [] for c in contenders}
            for rep in range(args.reps):
                order = sorted(contenders)
                random.Random(rep).shuffle(order)
                for c in order:
                    times[c].append(_run(mpiexec, args.python, script, n, args.epoch,
                                         dict(base, **contenders[c]), work))
                print('{} ranks, repetition {}: {}'.format(n, rep, {c: round(t[-1], 2) for c, t in times.items()}),
                      flush=True)
            med = {c: statistics.median(t) for c, t in times.items()}
            best = min((c for c in contenders if c.startswith('OMP')), key=med.get)
            paired = {b: statistics.median(d / o for d, o in zip(times['default'], times[b]))
                      for b in (best, 'CHAINERMN_THREADS=0')}
            result['ranks'][n] = {'times_s': times, 'median_s': med, 'best_omp': best,
                                  'default_over_best_omp': med['default'] / med[best],
                                  'old_default_over_default': med['CHAINERMN_THREADS=0'] / med['default'],
                                  'paired_default_over': paired}
            print('== {} ranks on {} CPUs, {} epochs, {} repetitions (median s): {}'.format(
                n, cpus, args.epoch, args.reps, {c: round(v, 2) for c, v in med.items()}))
            print('   default / best ({}): {:.3f} (per repetition {:.3f}); CHAINERMN_THREADS=0 / default: '
                  '{:.2f} (per repetition {:.2f})'.format(
                      best, med['default'] / med[best], paired[best],
                      med['CHAINERMN_THREADS=0'] / med['default'], 1 / paired['CHAINERMN_THREADS=0']),
                  flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return report.save(result, args.out)


if __name__ == '__main__':
    main()
