"""Whole ResNet-50 iterations on a namespace cluster: chainermn's thread pools against one thread by hand.

Usage (as root, from the repo root):
    .venv/bin/python bench/iteration_threads.py [--layouts 2x1,2x2] [--link none] [--reps 3]
        [--iters 3] [--modes plain,compute] [--out FILE.json]

For every layout NODESxRANKS a cluster of namespaces is built (``chainermn_tools.cluster``) and
``bench/iteration.py``'s worker (ResNet-50 of ``bench/iteration.py``, ``--size full``) runs as
alternating jobs: ``default`` (no thread variable set: each rank sizes its pools at communicator
creation) and ``OPENBLAS_NUM_THREADS=1`` (with ``OMP_NUM_THREADS`` and ``MKL_NUM_THREADS``, as
``bench/cluster.py`` sets them by hand), ``--reps`` times each, in an order that changes with the
repetition.  Thread pools are per process, so the contenders cannot share a job; alternating the
jobs is the interleaving.  Printed: each mode's median per job and contender, and the medians of
``default / one thread`` over the repetitions.
"""

import argparse
import json
import os
import statistics
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import report  # noqa: E402

__all__ = ['main']

CONTENDERS = {'default': {}, 'OPENBLAS_NUM_THREADS=1': {'OPENBLAS_NUM_THREADS': '1', 'OMP_NUM_THREADS': '1',
                                                        'MKL_NUM_THREADS': '1'}}


def main(argv=None):
    from chainermn_tools.cluster import Cluster
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--layouts', default='2x1,2x2')
    p.add_argument('--link', default='none', help='link rate in Gbit/s (none: unthrottled)')
    p.add_argument('--reps', type=int, default=3)
    p.add_argument('--iters', type=int, default=3)
    p.add_argument('--batch', type=int, default=None)
    p.add_argument('--modes', default='plain,compute')
    p.add_argument('--timeout', type=float, default=1800)
    p.add_argument('--out', default=None)
    args = p.parse_args(argv)
    gbit = None if args.link == 'none' else float(args.link)
    clear = ('OMP_NUM_THREADS', 'OPENBLAS_NUM_THREADS', 'MKL_NUM_THREADS', 'CHAINERMN_THREADS',
             'CHAINERMN_THREADS_CHOSEN')
    for name in clear:
        os.environ.pop(name, None)
    result = {'meta': {'command': ' '.join(sys.argv), 'cpus': len(os.sched_getaffinity(0)),
                       'loadavg_before': os.getloadavg()}, 'layouts': {}}
    work = tempfile.mkdtemp(prefix='chainermn-iter-threads-')
    for layout in args.layouts.split(','):
        nodes, k = (int(v) for v in layout.split('x'))
        runs = {c: [] for c in CONTENDERS}
        with Cluster(nodes=nodes, link_gbit=gbit) as cluster:
            for rep in range(args.reps):
                order = sorted(CONTENDERS, reverse=bool(rep % 2))
                for c in order:
                    out = os.path.join(work, 'iter.json')
                    argv = [os.path.join(HERE, 'iteration.py'), '--worker', '--size', 'full', '--models',
                            'resnet', '--iters', str(args.iters), '--warmup', '1', '--modes', args.modes,
                            '--out', out] + (['--batch', str(args.batch)] if args.batch else [])
                    res = cluster.mpiexec(argv, ranks_per_node=k, timeout=args.timeout, cwd=ROOT,
                                          env=dict(CONTENDERS[c], PYTHONUNBUFFERED='1'))
                    if res.returncode != 0:
                        raise SystemExit('iteration_threads: {} {} failed ({}):\n{}\n{}'.format(
                            layout, c, res.returncode, res.stdout[-3000:], res.stderr[-3000:]))
                    with open(out) as f:
                        (entry,) = json.load(f).values()
                    runs[c].append(entry['median_s'])
                    print('{} rep {} {:<24s} {}'.format(layout, rep, c, {m: round(v, 3) for m, v in
                                                                          entry['median_s'].items()}),
                          flush=True)
        modes = sorted(runs['default'][0])
        ratio = {m: statistics.median(d[m] / o[m] for d, o in zip(runs['default'], runs['OPENBLAS_NUM_THREADS=1']))
                 for m in modes}
        result['layouts'][layout] = {'runs_median_s': runs, 'default_over_one_thread': ratio}
        print('== {} ({}): default / OPENBLAS_NUM_THREADS=1 per mode (median of {} paired jobs): {}'.format(
            layout, 'unthrottled' if gbit is None else '{:g} Gbit/s'.format(gbit), args.reps,
            {m: round(v, 3) for m, v in ratio.items()}), flush=True)
    return report.save(result, args.out)


if __name__ == '__main__':
    main()
