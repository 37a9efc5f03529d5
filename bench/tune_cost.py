"""What the tuner's first schedule costs, in updates, against an older commit's schedule, interleaved.

Usage (from the repo root; the cluster needs root):
    .venv/bin/python bench/tune_cost.py --single-host 2 [--reps 5] [--models resnet50,mlp]
    .venv/bin/python bench/tune_cost.py --cluster 2x1,2x2 --links 1,10,none [--reps 3]
        [--old be1dd46] [--grad-dtype auto] [--out FILE.json]

Every repetition creates a fresh ``naive`` communicator of each contender (the checkout: ``new``;
each ``--old`` commit's ``chainermn_comm``, taken out of git as ``bench/single_host.py`` does), in
an order that changes with the repetition, and calls ``multi_node_mean_grad`` on the model's
gradients until its tuner's first schedule is over (timed: the slowest rank per call, after a
pause that fills a shaped link's token bucket), then ``--steady`` more calls.  The schedule's cost
is its calls' time minus as many calls at the steady median, in steady calls (updates); call 1
(buffers and shared memory, whatever the configuration) is left out, as in ``bench/cluster.py``.
Printed per configuration: each contender's calls and the median and maximum cost over the
repetitions.
"""

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import report  # noqa: E402

from single_host import extract_old, old_name  # noqa: E402

__all__ = ['main']


def _worker(args):
    import numpy
    from mpi4py import MPI

    import models
    comm = MPI.COMM_WORLD
    factories = {'new': __import__('chainermn_comm').create_communicator}
    if args.old_path:
        sys.path.insert(0, args.old_path)
        for commit in filter(None, args.old.split(',')):
            factories['old_' + commit] = __import__(old_name(commit)).create_communicator
    dtype = {'auto': 'auto', 'none': None, 'float16': numpy.float16}[args.grad_dtype]
    link = models.make_link(models.param_shapes(args.model, args.size), seed=comm.Get_rank())

    def timed(c):
        if args.settle:
            time.sleep(args.settle)
        comm.Barrier()
        t0 = time.perf_counter()
        c.multi_node_mean_grad(link)
        return comm.allreduce(time.perf_counter() - t0, op=MPI.MAX)

    out = {name: [] for name in factories}
    for rep in range(args.reps):
        order = sorted(factories)
        random.Random(rep).shuffle(order)
        for name in order:
            c = factories[name]('naive', allreduce_grad_dtype=dtype)
            times = []
            while len(times) < 60:
                times.append(timed(c))
                tuned = getattr(c, '_tuned', None)
                tuner = tuned.tuning.tuner if tuned is not None else None
                if tuner is None or not tuner.tuning:
                    break
            steady = [timed(c) for _ in range(args.steady)]
            med = statistics.median(steady)
            history = [] if tuner is None else tuner.history
            out[name].append({
                'calls': len(times), 'times_s': times, 'steady_s': steady,
                'cost_updates': (sum(times[1:]) - (len(times) - 1) * med) / med,
                'choice': {k: str(v) for k, v in history[-1][2].items()} if history else {},
                'figures_s': history[-1][1] if history else {}})
            c.finalize()
    if comm.Get_rank() == 0:
        with open(args.out, 'w') as f:
            json.dump(out, f)


def _summary(runs):
    costs = [r['cost_updates'] for r in runs]
    return {'calls': sorted({r['calls'] for r in runs}), 'cost_median': statistics.median(costs),
            'cost_max': max(costs), 'costs': costs,
            'steady_ms': statistics.median(statistics.median(r['steady_s']) for r in runs) * 1e3,
            'choices': [r['choice'] for r in runs], 'runs': runs}


def _argv(args, model, old_path, out):
    return [os.path.abspath(__file__), '--worker', '--model', model, '--size', args.size,
            '--reps', str(args.reps), '--steady', str(args.steady), '--grad-dtype', args.grad_dtype,
            '--old', args.old, '--old-path', old_path, '--out', out, '--settle', repr(args.settle)]


def _print(where, model, res):
    for name, s in sorted(res.items()):
        print('{:<28s} {:<9s} {:<14s} calls {:<8s} steady {:7.1f} ms  cost median {:5.2f} max {:5.2f} '
              'updates'.format(where, model, name, ','.join(map(str, s['calls'])), s['steady_ms'],
                               s['cost_median'], s['cost_max']), flush=True)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--single-host', type=int, default=0, help='ranks on this host (0: none)')
    p.add_argument('--cluster', default='', help='NODESxRANKS layouts on a namespace cluster, e.g. 2x1,2x2')
    p.add_argument('--links', default='1,10,none', help='link rates in Gbit/s for --cluster (none: unthrottled)')
    p.add_argument('--models', default='resnet50')
    p.add_argument('--size', choices=('tiny', 'full'), default='full')
    p.add_argument('--reps', type=int, default=5)
    p.add_argument('--steady', type=int, default=7)
    p.add_argument('--grad-dtype', choices=('auto', 'none', 'float16'), default='auto')
    p.add_argument('--old', default='be1dd46', help="older commits to compare with ('' for none)")
    p.add_argument('--settle', type=float, default=None, help='seconds of idle link before each call')
    p.add_argument('--timeout', type=float, default=3600)
    p.add_argument('--out', default=None)
    p.add_argument('--worker', action='store_true', help=argparse.SUPPRESS)
    p.add_argument('--model', default='resnet50', help=argparse.SUPPRESS)
    p.add_argument('--old-path', default='', help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        return _worker(args)
    tmp = tempfile.mkdtemp(prefix='chainermn-tune-cost-')
    env = {'OPENBLAS_NUM_THREADS': '1', 'OMP_NUM_THREADS': '1', 'PYTHONUNBUFFERED': '1'}
    result = {'meta': {'command': ' '.join(sys.argv), 'loadavg_before': os.getloadavg(),
                       'cpu_count': os.cpu_count()}, 'runs': []}
    try:
        old_path = ''
        for commit in filter(None, args.old.split(',')):
            old_path = extract_old(commit, tmp)
        out = os.path.join(tmp, 'w.json')
        if args.single_host:
            args.settle = args.settle or 0.0
            mpiexec = os.path.join(os.path.dirname(sys.executable), 'mpiexec')
            for model in args.models.split(','):
                subprocess.run([mpiexec, '-n', str(args.single_host), sys.executable]
                               + _argv(args, model, old_path, out), check=True, cwd=ROOT,
                               env=dict(os.environ, **env), timeout=args.timeout)
                with open(out) as f:
                    res = {k: _summary(v) for k, v in json.load(f).items()}
                where = 'one host, {} ranks'.format(args.single_host)
                _print(where, model, res)
                result['runs'].append({'where': where, 'model': model, 'contenders': res})
        if args.cluster:
            from chainermn_tools.cluster import Cluster
            from chainermn_tools.cluster._net import BURST_SECONDS
            args.settle = 3 * BURST_SECONDS if args.settle is None else args.settle
            layouts = [tuple(int(x) for x in v.split('x')) for v in args.cluster.split(',')]
            for link in args.links.split(','):
                gbit = None if link == 'none' else float(link)
                for nodes in sorted({n for n, _ in layouts}):
                    with Cluster(nodes=nodes, link_gbit=gbit) as cluster:
                        for n, k in layouts:
                            if n != nodes:
                                continue
                            for model in args.models.split(','):
                                res = cluster.mpiexec(_argv(args, model, old_path, out), ranks_per_node=k,
                                                      timeout=args.timeout, env=env, cwd=ROOT)
                                if res.returncode != 0:
                                    raise SystemExit('tune_cost: {}x{} failed ({}):\n{}\n{}'.format(
                                        n, k, res.returncode, res.stdout[-3000:], res.stderr[-3000:]))
                                with open(out) as f:
                                    res = {k2: _summary(v) for k2, v in json.load(f).items()}
                                where = '{}x{} {}'.format(n, k, 'unthrottled' if gbit is None
                                                          else '{:g} Gbit/s'.format(gbit))
                                _print(where, model, res)
                                result['runs'].append({'where': where, 'model': model, 'contenders': res})
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return report.save(result, args.out)


if __name__ == '__main__':
    main()
