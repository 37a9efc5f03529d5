"""What tracing and live straggler detection cost per training iteration.

Usage: python bench/trace_cost.py [--ranks 2] [--models allreduce,mnist,resnet] [--size full|tiny]
                                  [--rounds R] [--block K] [--warmup W] [--procs P]
                                  [--baseline-src CHECKOUT] [--out FILE.json]

Models: ``allreduce`` is one ``comm.allreduce`` of one float (the cost per collective call, the
agreement check included); ``mnist`` is examples/mnist's model (a 3-layer perceptron of 1000
units, 10 classes, on 8x8 digits, batch 100 per rank); ``resnet`` is ResNet-50 from
bench/iteration.py (batch 2 of 3x64x64 per rank; ``--size tiny`` shrinks them).  Each iteration
is ``MultiNodeOptimizer.update`` (forward, backward, gradient all-reduce, Adam), as a trainer
runs it.

Modes, interleaved in random order every round inside one job (``CHAINERMN_TRACE`` set, the
switches flipped between rounds): ``off`` (tracing off, straggler detection on: the default),
``trace`` (recording), ``nostraggler`` (tracing and straggler detection off).  With
``--baseline-src`` a checkout without tracing (e.g. ``git worktree add /tmp/base <commit>``) runs
as ``before`` in separate jobs, alternating with ours (``--procs`` jobs each), so ``off/before``
shows what the instrumentation costs when it is off.  Rank 0 prints each mode's median
iteration time (the slowest rank's, per block of ``--block`` iterations) and the ratios
trace/off (target <= 1.03) and off/nostraggler (the live detection, target <= 1.01), each the
median of the per-round ratios (the modes of a round run back to back, which cancels slow swings
of a busy machine), and off/before (target: no measurable change), the ratio of the best rounds
(they ran in different jobs).
"""

import argparse
import glob
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
MODES = ('off', 'trace', 'nostraggler')


def _model(name, size):
    import chainer
    import chainer.functions as F
    import chainer.links as L
    import numpy
    rng = numpy.random.RandomState(0)
    if name == 'mnist':
        sys.path.insert(0, os.path.join(ROOT, 'examples', 'mnist'))
        from train_mnist import MLP  # the example's model
        units, batch = (1000, 100) if size == 'full' else (50, 8)
        model = L.Classifier(MLP(units, 10))
        x = rng.rand(batch, 64).astype(numpy.float32)
        t = rng.randint(0, 10, size=batch).astype(numpy.int32)
        return model, model, x, t
    sys.path.insert(0, HERE)
    from iteration import _models
    net, x, batch = _models(size)['resnet']
    t = rng.randint(0, 10, size=batch).astype(numpy.int32)

    def loss(xb, tb):
        return F.softmax_cross_entropy(net(xb), tb)
    return net, loss, x, t


def worker(args):
    import chainer
    from mpi4py import MPI

    import chainermn_comm
    import chainermn_train
    before = args.mode == 'before'
    comm = chainermn_comm.create_communicator('naive')
    if args.model == 'allreduce':  # one guarded collective: the per-call cost, in microseconds
        import numpy
        one = numpy.ones(1, numpy.float32)

        def step():
            comm.allreduce(one)
    else:
        model, loss, x, t = _model(args.model, args.size)
        opt = chainermn_train.create_multi_node_optimizer(chainer.optimizers.Adam(), comm)
        opt.setup(model)

        def step():
            opt.update(loss, x, t)
    modes = ['before'] if before else list(MODES)
    if not before:
        from chainermn_comm import trace
        agreement = comm._guard.agreement
        saved = (agreement.arrivals, agreement.detector)
        assert trace.ON, 'CHAINERMN_TRACE must be set for the modes to be switched'

        def switch(mode):
            trace.ON = mode == 'trace'
            agreement.arrivals = saved[0] and mode != 'nostraggler'
            agreement.detector = saved[1] if mode != 'nostraggler' else None
    world = MPI.COMM_WORLD
    for _ in range(args.warmup):
        step()
    times = {m: [] for m in modes}
    for r in range(args.rounds):
        order = list(modes)
        random.Random(r).shuffle(order)  # the same order on every rank
        for m in order:
            if not before:
                switch(m)
            world.Barrier()
            t0 = time.perf_counter()
            for _ in range(args.block):
                step()
            dt = (time.perf_counter() - t0) / args.block
            times[m].append(world.allreduce(dt, op=MPI.MAX))
    if not before:
        switch('off')
    if comm.rank == 0:
        with open(args.out, 'w') as f:
            json.dump(times, f)


def _paired(a, b):
    """Return the median of the per-round ratios ``a[i] / b[i]``."""
    return statistics.median(x / y for x, y in zip(a, b))


def _job(args, model, mode, out, env):
    mpiexec = os.path.join(os.path.dirname(sys.executable), 'mpiexec')
    cmd = [mpiexec, '-n', str(args.ranks), sys.executable, os.path.abspath(__file__), '--worker',
           '--model', model, '--mode', mode, '--size', args.size, '--rounds', str(args.rounds),
           '--block', str(args.block), '--warmup', str(args.warmup), '--out', out]
    subprocess.run(cmd, check=True, env=env, timeout=3600)
    with open(out) as f:
        return json.load(f)


def _env(baseline_src=None, trace_dir=None):
    env = dict(os.environ)
    for var in ('OPENBLAS_NUM_THREADS', 'OMP_NUM_THREADS', 'MKL_NUM_THREADS'):
        env.setdefault(var, '1')
    for var in ('CHAINERMN_TRACE', 'CHAINERMN_STRAGGLER'):
        env.pop(var, None)
    if trace_dir:
        env['CHAINERMN_TRACE'] = trace_dir
    if baseline_src:
        srcs = sorted(glob.glob(os.path.join(baseline_src, 'packages', '*', 'src')))
        if not srcs:
            raise SystemExit('--baseline-src {}: no packages/*/src there'.format(baseline_src))
        env['PYTHONPATH'] = os.pathsep.join(srcs + [p for p in env.get('PYTHONPATH', '').split(
            os.pathsep) if p])
    return env


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--ranks', type=int, default=2)
    p.add_argument('--models', default='allreduce,mnist,resnet')
    p.add_argument('--size', choices=('tiny', 'full'), default='full')
    p.add_argument('--rounds', type=int, default=10, help='rounds of every mode per job')
    p.add_argument('--block', type=int, default=None, help='iterations per round and mode')
    p.add_argument('--warmup', type=int, default=2)
    p.add_argument('--procs', type=int, default=1, help='jobs of ours (and of the baseline) per model')
    p.add_argument('--baseline-src', default=None, help='a checkout without tracing, run as "before"')
    p.add_argument('--out', default=os.path.join(HERE, 'trace_cost.json'))
    p.add_argument('--worker', action='store_true', help=argparse.SUPPRESS)
    p.add_argument('--model', help=argparse.SUPPRESS)
    p.add_argument('--mode', help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker(args)
    result = {'ranks': args.ranks, 'size': args.size, 'rounds': args.rounds, 'procs': args.procs,
              'baseline_src': args.baseline_src, 'models': {}}
    tmp = tempfile.mkdtemp(prefix='trace_cost.')
    try:
        for model in args.models.split(','):
            if args.block is None:
                args.block = {'allreduce': 2000, 'mnist': 20}.get(model, 2)
            times = {}
            jobs = ['now'] + (['before'] if args.baseline_src else [])
            for i in range(args.procs):
                for job in (jobs if i % 2 == 0 else jobs[::-1]):
                    out = os.path.join(tmp, '{}.{}.{}.json'.format(model, job, i))
                    trace_dir = os.path.join(tmp, 'trace.{}.{}'.format(model, i))
                    env = _env(args.baseline_src if job == 'before' else None,
                               None if job == 'before' else trace_dir)
                    for m, v in _job(args, model, job, out, env).items():
                        times.setdefault(m, []).extend(v)
                    shutil.rmtree(trace_dir, ignore_errors=True)
            med = {m: statistics.median(v) for m, v in times.items()}
            # Modes of one round ran back to back: the median of their per-round ratios cancels
            # the machine's slow swings.  'before' ran in other jobs: compare the best rounds.
            ratios = {'trace/off': _paired(times['trace'], times['off']),
                      'off/nostraggler': _paired(times['off'], times['nostraggler'])}
            if 'before' in med:
                ratios['off/before'] = min(times['off']) / min(times['before'])
            result['models'][model] = {'median_s': med, 'min_s': {m: min(v) for m, v in times.items()},
                                       'times_s': times, 'ratios': ratios, 'block': args.block}
            args.block = None if '--block' not in sys.argv else args.block
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    with open(args.out, 'w') as f:
        json.dump(result, f, indent=1)
    cols = ('before', 'off', 'trace', 'nostraggler')
    print('median per iteration (slowest rank); ratios: trace/off and off/nostraggler per round, '
          'off/before of the best rounds')
    print('{:<12s}'.format('model@n') + ''.join('{:>15s}'.format(c + ' us') for c in cols) +
          '{:>11s}{:>17s}{:>12s}'.format('trace/off', 'off/nostraggler', 'off/before'))
    for model, e in result['models'].items():
        med, r = e['median_s'], e['ratios']
        print('{:<12s}'.format('{}@{}'.format(model, args.ranks)) +
              ''.join('{:>15.1f}'.format(med[c] * 1e6) if c in med else '{:>15s}'.format('-')
                      for c in cols) +
              '{:>11.4f}{:>17.4f}'.format(r['trace/off'], r['off/nostraggler']) +
              ('{:>12.4f}'.format(r['off/before']) if 'off/before' in r else '{:>12s}'.format('-')))


if __name__ == '__main__':
    main()
