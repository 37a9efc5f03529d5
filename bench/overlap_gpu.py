"""GPU overlap benchmark: how much of the gradient all-reduce backward hides (issue 7's GPU target).

Run on every rank, one GPU per rank:
``mpiexec -n N python bench/overlap_gpu.py [--width 4096] [--depth 8] [--iters 20]``
(with one rank, set ``CHAINERMN_OVERLAP_MODE=stream`` so that the side-stream path runs).

Prints and writes as JSON (``--out``), medians over ``--iters``:
compute (forward + backward, no communication), all-reduce alone (``multi_node_mean_grad`` after
backward), plain (backward then all-reduce), overlap (``run_backward``), exposed communication
(overlap - compute) and its fraction of the all-reduce alone (target <= 0.25).
"""

import argparse
import json
import statistics
import time

import chainer
import chainer.functions as F
import chainer.links as L
import numpy
from mpi4py import MPI

import chainermn_comm
from chainermn_train._overlap import BackwardOverlap


class Deep(chainer.Chain):
    def __init__(self, width, depth):
        super().__init__()
        self.depth = depth
        with self.init_scope():
            for k in range(depth):
                setattr(self, 'l{}'.format(k), L.Linear(width, width))

    def __call__(self, x):
        h = x
        for k in range(self.depth):
            h = F.relu(getattr(self, 'l{}'.format(k))(h))
        return F.sum(h * h)


def main():
    import cupy
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--comm', default='pure_nccl')
    ap.add_argument('--width', type=int, default=4096)
    ap.add_argument('--depth', type=int, default=8)
    ap.add_argument('--batch', type=int, default=256)
    ap.add_argument('--iters', type=int, default=20)
    ap.add_argument('--out', default=None)
    args = ap.parse_args()
    comm = chainermn_comm.create_communicator(args.comm)
    cupy.cuda.Device(comm.intra_rank).use()
    model = Deep(args.width, args.depth)
    model.to_gpu()
    comm.bcast_data(model)
    x = cupy.random.standard_normal((args.batch, args.width), dtype=numpy.float32)
    ov = BackwardOverlap(comm, model)

    def timed(fn):
        comm.mpi_comm.Barrier()
        cupy.cuda.get_current_stream().synchronize()
        t0 = time.perf_counter()
        fn()
        cupy.cuda.Device().synchronize()
        return comm.mpi_comm.allreduce(time.perf_counter() - t0, op=MPI.MAX)

    def compute():
        model.cleargrads()
        model(x).backward()

    def allreduce_alone():
        comm.multi_node_mean_grad(model)

    def plain():
        compute()
        comm.multi_node_mean_grad(model)

    def overlap():
        model.cleargrads()
        ov.run_backward(model(x))

    cases = {'compute': compute, 'plain': plain, 'overlap': overlap}
    times = {k: [] for k in list(cases) + ['allreduce_alone']}
    for it in range(args.iters + 2):
        for name, fn in cases.items():
            t = timed(fn)
            if it >= 2:
                times[name].append(t)
        compute()
        t = timed(allreduce_alone)
        if it >= 2:
            times['allreduce_alone'].append(t)
    med = {k: statistics.median(v) for k, v in times.items()}
    nbytes = sum(p.array.nbytes for p in model.params())
    exposed = med['overlap'] - med['compute']
    result = {'ranks': comm.size, 'comm': args.comm, 'grad_bytes': nbytes,
              'device': cupy.cuda.runtime.getDeviceProperties(0)['name'].decode(),
              'median_s': med, 'exposed_overlap_s': exposed,
              'exposed_plain_s': med['plain'] - med['compute'],
              'exposed_over_allreduce_alone (target <= 0.25)': exposed / med['allreduce_alone'],
              'early_params': ov.early_params}
    if comm.rank == 0:
        for k, v in result.items():
            print('{:<48s} {}'.format(k, v))
        if args.out:
            with open(args.out, 'w') as f:
                json.dump(result, f, indent=1)


if __name__ == '__main__':
    main()
