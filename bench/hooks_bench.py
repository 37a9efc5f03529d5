"""Communication hooks timed against the wires: the ResNet-50 gradient average and whole iterations.

Run on every rank under mpiexec (``bench/hooks_cluster.py`` drives it on a cluster of namespaces).

  --part average    the ResNet-50 gradient set (bench/models.py) averaged by each contender, rounds
                    interleaved, each sample the median of ``--calls`` calls (slowest rank), compute
                    included: float32, float16, bfloat16 (the built-in wires), PowerSGD rank 4
                    (error feedback, warm start, compressing from its first call), Auto() and
                    Auto(powersgd=PowerSGD(rank=4)) (their tuning schedules run first, timed apart).
  --part iteration  whole ResNet-50 iterations (forward, backward, average, MomentumSGD update) with
                    float32, bfloat16 and PowerSGD rank 4, and compute only (no average).

Rank 0 writes the JSON named by ``--out``.
"""

import argparse
import json
import os
import random
import statistics
import sys
import time

import numpy
from mpi4py import MPI

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import models  # noqa: E402

AVERAGE = ('float32', 'float16', 'bfloat16', 'powersgd_r4', 'auto', 'auto_powersgd')
ITERATION = ('float32', 'bfloat16', 'powersgd_r4', 'compute')


def make_hooks(names, rank):
    from chainermn_comm import hooks
    table = {'float32': hooks.Exact, 'float16': hooks.Float16, 'bfloat16': hooks.BFloat16,
             'auto': hooks.Auto,
             'powersgd_r4': lambda: hooks.PowerSGD(rank=rank, start_update=0),
             'auto_powersgd': lambda: hooks.Auto(powersgd=hooks.PowerSGD(rank=rank, start_update=0))}
    return {n: table[n]() for n in names if n in table}


def _timed(mpi, fn, settle):
    if settle:
        time.sleep(settle)  # a full token bucket at every start (see bench/cluster.py)
    mpi.Barrier()
    t0 = time.perf_counter()
    fn()
    return mpi.allreduce(time.perf_counter() - t0, op=MPI.MAX)


def _tuning(hook):
    """Return whether an Auto hook still runs its first schedule."""
    inner = getattr(hook, '_tuning', None)
    if getattr(hook, 'powersgd', None) is None:
        return None
    return inner is None or inner.tuner is None or inner.tuner.tuning


def _rounds(mpi, fns, args, settle):
    names = sorted(fns)
    times = {n: [] for n in names}
    for r in range(args.warmup + args.rounds):
        order = list(names)
        random.Random(1000 + r).shuffle(order)  # the same order on every rank
        for n in order:
            dt = statistics.median(_timed(mpi, fns[n], settle) for _ in range(args.calls))
            if r >= args.warmup:
                times[n].append(dt)
    return {n: {'median_s': statistics.median(v), 'min_s': min(v), 'times_s': v} for n, v in times.items()}


def average(args, comm, mpi):
    from chainermn_comm import hooks
    shapes = models.param_shapes('resnet50', args.size)
    link = models.make_link(shapes, seed=comm.rank)
    contenders = make_hooks(args.contenders.split(','), args.rank)
    fns = {n: (lambda h=h: hooks.mean_model(comm, link, h)) for n, h in contenders.items()}
    tuning = {}
    for n in sorted(fns):  # first calls (buffers) and the tuners' schedules, timed apart
        spent = [_timed(mpi, fns[n], args.settle)]
        while len(spent) < 60 and (_tuning(contenders[n]) or (n == 'auto' and not comm._wire_tuned('auto'))):
            spent.append(_timed(mpi, fns[n], args.settle))
        tuning[n] = {'calls': len(spent), 'times_s': spent}
        if hasattr(contenders[n], 'choice'):
            tuning[n]['choice'] = str(contenders[n].choice)
    out = {'bytes': sum(int(numpy.prod(s)) * 4 for _, s in shapes), 'arrays': len(shapes),
           'contenders': _rounds(mpi, fns, args, args.settle), 'tuning': tuning}
    for n, h in contenders.items():
        if getattr(h, 'last', None):
            out['contenders'][n]['last_call'] = dict(h.last)
        inner = getattr(h, '_tuning', None)
        if inner is not None and inner.tuner is not None and inner.tuner.history:
            out['contenders'][n]['schedule_ms'] = {k: {kk: round(vv * 1e3, 2) for kk, vv in v.items()}
                                                   for k, v in inner.tuner.history[-1][1].items()}
            out['contenders'][n]['choice'] = str(h.choice)
    return out


def iteration(args, comm, mpi):
    import chainer
    import chainer.functions as F
    from chainer.links.model.vision.resnet import ResNet50Layers

    from chainermn_comm import hooks

    class Res50(chainer.Chain):
        def __init__(self):
            super().__init__()
            with self.init_scope():
                self.net = ResNet50Layers(pretrained_model=None)

        def __call__(self, x):
            return self.net(x, layers=['fc6'])['fc6']

    rng = numpy.random.RandomState(comm.rank)
    model = Res50()
    x = rng.rand(args.batch, 3, args.image, args.image).astype(numpy.float32)
    t = rng.randint(0, 10, size=args.batch).astype(numpy.int32)
    opt = chainer.optimizers.MomentumSGD(lr=1e-4)
    opt.setup(model)
    comm.bcast_data(model)
    contenders = make_hooks(args.contenders.split(','), args.rank)

    def step(hook):
        model.cleargrads()
        loss = F.softmax_cross_entropy(model(x), t)
        loss.backward()
        if hook is not None:
            hooks.mean_model(comm, model, hook)
        opt.update()

    fns = {n: (lambda h=h: step(h)) for n, h in contenders.items()}
    if 'compute' in args.contenders.split(','):
        fns['compute'] = lambda: step(None)
    for n in sorted(fns):
        _timed(mpi, fns[n], 0.0)  # buffers, first Q
    out = {'grad_bytes': sum(p.size * 4 for p in model.params()), 'batch': args.batch,
           'input_shape': list(x.shape), 'contenders': _rounds(mpi, fns, args, 0.0)}
    comp = out['contenders'].get('compute', {}).get('median_s')
    if comp:
        out['exposed_s'] = {n: c['median_s'] - comp for n, c in out['contenders'].items()}
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--part', choices=('average', 'iteration'), default='average')
    p.add_argument('--contenders', default=None)
    p.add_argument('--rank', type=int, default=4, help="PowerSGD's rank")
    p.add_argument('--size', choices=('tiny', 'full'), default='full')
    p.add_argument('--rounds', type=int, default=5)
    p.add_argument('--warmup', type=int, default=1)
    p.add_argument('--calls', type=int, default=1)
    p.add_argument('--batch', type=int, default=32, help='per rank (iteration part)')
    p.add_argument('--image', type=int, default=64, help='image side in pixels (iteration part)')
    p.add_argument('--settle', type=float, default=0.0, help='idle link seconds before each timed call')
    p.add_argument('--out', required=True)
    args = p.parse_args()
    if args.contenders is None:
        args.contenders = ','.join(AVERAGE if args.part == 'average' else ITERATION)
    import chainermn_comm
    comm = chainermn_comm.create_communicator('naive')
    mpi = MPI.COMM_WORLD
    load = os.getloadavg()
    result = average(args, comm, mpi) if args.part == 'average' else iteration(args, comm, mpi)
    result['meta'] = {'ranks': comm.size, 'nodes': comm.inter_size, 'part': args.part, 'rank': args.rank,
                      'rounds': args.rounds, 'calls': args.calls, 'size': args.size,
                      'loadavg_before': load, 'loadavg_after': os.getloadavg()}
    if comm.rank == 0:
        with open(args.out, 'w') as f:
            json.dump(result, f, indent=1)


if __name__ == '__main__':
    main()
