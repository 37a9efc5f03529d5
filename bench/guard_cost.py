"""What the exit notice, the frozen-rank rule and the finite check cost (issue 41), in one job.

Usage (from the repo root; ``--cluster 2`` as root, on two nodes of namespaces):
    .venv/bin/python bench/guard_cost.py [-n 2] [--cluster NODES] [--old COMMIT]
        [--models resnet50,mnist] [--size full|tiny] [--rounds 15] [--block 5] [--out FILE.json]

Every contender runs in the same MPI job, each round in an order shuffled the same way on every
rank, so that load from other jobs on the machine falls on all of them alike:

- ``resnet50_new``: ``multi_node_mean_grad`` of the ResNet-50 gradient set (bench/models.py) on
  a communicator of this checkout (exit notice and frozen-rank rule on, their defaults);
- ``resnet50_old``: the same on ``--old COMMIT``'s ``chainermn_comm`` (taken out of git like
  bench/single_host.py does), which has neither;
- ``resnet50_new_off``: this checkout with ``CHAINERMN_EXIT_NOTICE=0`` and
  ``CHAINERMN_UNRESPONSIVE_SECONDS=0`` (read when that communicator was made);
- ``resnet50_finite``: ``resnet50_new`` plus the multi-node optimizer's finite check
  (``chainermn_train._finite.FiniteCheck``: every rank looks at its own gradients, the word rides
  the average's agreement check, then every rank reads every rank's word);
- ``resnet50_scan``: the finite check's own pass alone (``first_nonfinite`` of the gradients);
- ``mnist_new``/``mnist_old``/``mnist_new_off``: ``--block`` iterations of examples/mnist's model
  (batch 100, Adam, ``MultiNodeOptimizer.update``) on each of those communicators.

Each time is the slowest rank's.  Printed: median and best per contender, and the median of
the per-round ratios new/old, new/new_off, finite/new (the check's share of the average).
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

RATIOS = [('resnet50_new', 'resnet50_old'), ('resnet50_new', 'resnet50_new_off'),
          ('resnet50_finite', 'resnet50_new'), ('resnet50_scan', 'resnet50_new'),
          ('mnist_new', 'mnist_old'),
          ('mnist_new', 'mnist_new_off')]


def _comms(old_path, old):
    """Return {'new', 'new_off', 'old'}: communicators of this checkout (features on, off) and of ``old``."""
    import chainermn_comm
    comms = {'new': chainermn_comm.create_communicator('naive')}
    saved = {k: os.environ.get(k) for k in ('CHAINERMN_EXIT_NOTICE', 'CHAINERMN_UNRESPONSIVE_SECONDS')}
    os.environ.update(CHAINERMN_EXIT_NOTICE='0', CHAINERMN_UNRESPONSIVE_SECONDS='0')
    comms['new_off'] = chainermn_comm.create_communicator('naive')
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k)
        else:
            os.environ[k] = v
    if old_path:
        sys.path.insert(0, old_path)
        from single_host import old_name
        comms['old'] = __import__(old_name(old)).create_communicator('naive')
    return comms


def _mnist(comm, size):
    import chainer
    import chainer.links as L
    import numpy

    import chainermn_train
    sys.path.insert(0, os.path.join(ROOT, 'examples', 'mnist'))
    from train_mnist import MLP
    rng = numpy.random.RandomState(0)
    units, batch = (1000, 100) if size == 'full' else (50, 8)
    model = L.Classifier(MLP(units, 10))
    x = rng.rand(batch, 64).astype(numpy.float32)
    t = rng.randint(0, 10, size=batch).astype(numpy.int32)
    opt = chainermn_train.create_multi_node_optimizer(chainer.optimizers.Adam(), comm)
    opt.setup(model)
    return lambda: opt.update(model, x, t)


def _worker(args):
    from mpi4py import MPI

    import models
    from chainermn_train._finite import FiniteCheck
    world = MPI.COMM_WORLD
    comms = _comms(args.old_path, args.old)
    cont = {}
    if 'resnet50' in args.models:
        link = models.make_link(models.param_shapes('resnet50', args.size), seed=world.Get_rank())
        for name, c in comms.items():
            cont['resnet50_' + name] = (lambda c=c: c.multi_node_mean_grad(link), 1)
        check = FiniteCheck(comms['new'], 'skip')

        def finite():
            check.before(link)
            comms['new'].multi_node_mean_grad(link)
            assert check.after(0) is None
        cont['resnet50_finite'] = (finite, 1)
        from chainermn_train._finite import first_nonfinite
        params = [p for _, p in sorted(link.namedparams())]
        cont['resnet50_scan'] = (lambda: first_nonfinite(params), 1)  # the check's own pass
    if 'mnist' in args.models:
        for name, c in comms.items():
            step = _mnist(c, args.size)
            cont['mnist_' + name] = (lambda s=step: [s() for _ in range(args.block)], args.block)
    for _ in range(args.warmup_calls):  # the tuners' schedules, before any timing
        for fn, _ in cont.values():
            fn()
    names = sorted(cont)
    times = {n: [] for n in names}
    for r in range(args.warmup + args.rounds):
        order = list(names)
        random.Random(r).shuffle(order)  # the same order on every rank
        for n in order:
            fn, calls = cont[n]
            world.Barrier()
            t0 = time.perf_counter()
            fn()
            dt = world.allreduce((time.perf_counter() - t0) / calls, op=MPI.MAX)
            if r >= args.warmup:
                times[n].append(dt)
    if world.Get_rank() == 0:
        with open(args.out, 'w') as f:
            json.dump({'times_s': times, 'ranks': world.Get_size()}, f)


def summarize(times):
    """Return medians, minima and the medians of the per-round ratios."""
    s = {'median_s': {n: statistics.median(v) for n, v in times.items()},
         'min_s': {n: min(v) for n, v in times.items()}, 'ratio_median': {}}
    for a, b in RATIOS:
        if a in times and b in times:
            s['ratio_median']['{}/{}'.format(a, b)] = statistics.median(
                x / y for x, y in zip(times[a], times[b]))
    return s


def _run(args, argv, env, tmp):
    if not args.cluster:
        mpiexec = os.path.join(os.path.dirname(sys.executable), 'mpiexec')
        subprocess.run([mpiexec, '-n', str(args.n), sys.executable] + argv, check=True, cwd=ROOT,
                       env=env, timeout=3600)
        return
    from chainermn_tools.cluster import Cluster
    with Cluster(nodes=args.cluster) as cluster:
        res = cluster.mpiexec([sys.executable] + argv, ranks_per_node=args.n, timeout=3600, env=env,
                              cwd=ROOT, python=False)
        if res.returncode != 0:
            raise SystemExit('the job failed ({}):\n{}\n{}'.format(res.returncode, res.stdout[-4000:],
                                                                  res.stderr[-4000:]))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('-n', type=int, default=2, help='ranks (per node with --cluster)')
    p.add_argument('--cluster', type=int, default=0, help='nodes of a namespace cluster (0: this host)')
    p.add_argument('--old', default='', help='the commit to compare with (e.g. the branch point)')
    p.add_argument('--models', default='resnet50,mnist')
    p.add_argument('--size', choices=('tiny', 'full'), default='full')
    p.add_argument('--rounds', type=int, default=15)
    p.add_argument('--warmup', type=int, default=2)
    p.add_argument('--warmup-calls', type=int, default=40, help='calls of each before the rounds (tuning)')
    p.add_argument('--block', type=int, default=5, help='mnist iterations per sample')
    p.add_argument('--out', default=None)
    p.add_argument('--worker', action='store_true', help=argparse.SUPPRESS)
    p.add_argument('--old-path', default='', help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        return _worker(args)
    tmp = tempfile.mkdtemp(prefix='chainermn-guard-cost-')
    try:
        old_path = ''
        if args.old:
            from single_host import extract_old
            old_path = extract_old(args.old, tmp)
        out = os.path.join(tmp, 'w.json')
        worker = [os.path.abspath(__file__), '--worker', '--models', args.models, '--size', args.size,
                  '--rounds', str(args.rounds), '--warmup', str(args.warmup), '--warmup-calls',
                  str(args.warmup_calls), '--block', str(args.block), '--old', args.old,
                  '--old-path', old_path, '--out', out]
        env = dict(os.environ, OPENBLAS_NUM_THREADS='1', OMP_NUM_THREADS='1', PYTHONUNBUFFERED='1')
        started = os.getloadavg()
        _run(args, worker, env, tmp)
        with open(out) as f:
            data = json.load(f)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    s = summarize(data['times_s'])
    where = '{} nodes x {} ranks'.format(args.cluster, args.n) if args.cluster else \
        '{} ranks on one host'.format(args.n)
    print('== {}, {} rounds, {} gradients (slowest rank per call; mnist: per iteration)'.format(
        where, args.rounds, args.size))
    for n in sorted(s['median_s']):
        print('  {:<20s} median {:9.2f} ms   best {:9.2f} ms'.format(n, s['median_s'][n] * 1e3,
                                                                     s['min_s'][n] * 1e3))
    for k, v in s['ratio_median'].items():
        print('  median of per-round {:<38s} {:.3f}'.format(k, v))
    if args.out:
        with open(args.out, 'w') as f:
            json.dump({'command': ' '.join(sys.argv), 'where': where, 'loadavg_before': started,
                       'loadavg_after': os.getloadavg(), 'summary': s, 'times_s': data['times_s']},
                      f, indent=1)
    return 0


if __name__ == '__main__':
    sys.exit(main())
