"""Cost of the default-mode agreement check: checked against unchecked calls, interleaved.

Run on every rank:  mpiexec -n 2 .venv/bin/python bench/check_cost.py [--rounds 15] [--out FILE]

Each round times every contender once, in an order shuffled the same way on every rank, so
that load from other jobs on the machine falls on checked and unchecked calls alike.  The
checked and unchecked runs use the same communicator (the check is switched per call through
``comm._guard.check``), so buffers and the shared-memory path are the same.  Rank 0 prints one
line per case: median and best seconds per call, checked and unchecked, and their ratios (the
issue's budget: 1.02 for multi_node_mean_grad, 1.5 for a one-float allreduce).  On a busy machine
the best of many samples tracks the quiet-machine cost better than the median.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import argparse  # noqa: E402
import json  # noqa: E402
import random  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import numpy  # noqa: E402
from mpi4py import MPI  # noqa: E402

import models  # noqa: E402

BUDGET = {'allreduce_1float': 1.5, 'mean_grad_resnet50': 1.02, 'mean_grad_mlp': 1.02}


def _cases(comm, size, small_calls):
    x = numpy.ones(1, numpy.float32)
    cases = {}

    def one_float():
        for _ in range(small_calls):
            comm.allreduce(x)

    cases['allreduce_1float'] = (one_float, small_calls)
    for model in models.MODELS:
        link = models.make_link(models.param_shapes(model, size), seed=comm.rank)
        cases['mean_grad_' + model] = (lambda link=link: comm.multi_node_mean_grad(link), 1)
    return cases


def _time(mpi, fn):
    mpi.Barrier()
    t0 = time.perf_counter()
    fn()
    return mpi.allreduce(time.perf_counter() - t0, op=MPI.MAX)


def main():
    import chainermn_comm
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--size', choices=('tiny', 'full'), default='full')
    p.add_argument('--rounds', type=int, default=15)
    p.add_argument('--warmup', type=int, default=2)
    p.add_argument('--small-calls', type=int, default=2000, help='one-float allreduces per sample')
    p.add_argument('--communicator', default='naive')
    p.add_argument('--out', default=None, help='also write the figures as JSON here (rank 0)')
    args = p.parse_args()
    comm = chainermn_comm.create_communicator(args.communicator)
    mpi = comm.mpi_comm
    guard = comm._guard
    if comm.size > 1 and not guard.check:
        sys.exit('the agreement check is off ($CHAINERMN_CHECK=0 or $CHAINERMN_DEBUG=1): nothing to compare')
    cases = _cases(comm, args.size, args.small_calls)
    runs = [(name, checked) for name in sorted(cases) for checked in (True, False)]
    times = {r: [] for r in runs}
    for rnd in range(args.warmup + args.rounds):
        order = list(runs)
        random.Random(rnd).shuffle(order)  # the same order on every rank
        for name, checked in order:
            fn, calls = cases[name]
            guard.check = checked and comm.size > 1
            dt = _time(mpi, fn) / calls
            if rnd >= args.warmup:
                times[(name, checked)].append(dt)
    guard.check = comm.size > 1
    result = {'ranks': comm.size, 'size': args.size, 'rounds': args.rounds,
              'communicator': args.communicator, 'cases': {}}
    for name in sorted(cases):
        on = statistics.median(times[(name, True)])
        off = statistics.median(times[(name, False)])
        on_min, off_min = min(times[(name, True)]), min(times[(name, False)])
        result['cases'][name] = {'checked_s': on, 'unchecked_s': off, 'ratio': on / off,
                                 'checked_min_s': on_min, 'unchecked_min_s': off_min,
                                 'ratio_of_minima': on_min / off_min,
                                 'budget': BUDGET.get(name), 'checked_all_s': times[(name, True)],
                                 'unchecked_all_s': times[(name, False)]}
    if comm.rank == 0:
        print('agreement check cost: {} ranks, {} rounds interleaved, communicator {!r}, sets {}'.format(
            comm.size, args.rounds, args.communicator, args.size))
        print('{:20s} {:>13s} {:>13s} {:>7s} {:>13s} {:>13s} {:>7s} {:>6s}'.format(
            'case', 'checked med', 'unchecked med', 'ratio', 'checked min', 'unchecked min', 'ratio',
            'budget'))
        for name, c in result['cases'].items():
            print('{:20s} {:>10.2f} us {:>10.2f} us {:>7.3f} {:>10.2f} us {:>10.2f} us {:>7.3f} {:>6}'.format(
                name, c['checked_s'] * 1e6, c['unchecked_s'] * 1e6, c['ratio'], c['checked_min_s'] * 1e6,
                c['unchecked_min_s'] * 1e6, c['ratio_of_minima'], c['budget'] or '-'))
        if args.out:
            with open(args.out, 'w') as f:
                json.dump(result, f, indent=1)


if __name__ == '__main__':
    main()
