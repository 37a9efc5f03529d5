"""Whole training iterations (forward + backward + all-reduce + update) at several rank counts.

Usage: python bench/iteration.py [--ranks 1,2] [--size tiny|full] [--iters N] [--out FILE.json]
Prints per model and rank count: iteration time with the plain path (backward, then
multi_node_mean_grad) and with BackwardOverlap, compute-only time (same iteration
without communication), exposed communication (iteration minus compute-only), and the
pack/unpack cost of the same gradients (copy into one buffer and back, scaled).
"""

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def _models(size):
    import chainer
    import chainer.functions as F
    import chainer.links as L
    import numpy

    class MLP(chainer.Chain):
        def __init__(self, n_in, n_units, n_out):
            super().__init__()
            with self.init_scope():
                self.l1 = L.Linear(n_in, n_units)
                self.l2 = L.Linear(n_units, n_units)
                self.l3 = L.Linear(n_units, n_out)

        def __call__(self, x):
            return self.l3(F.relu(self.l2(F.relu(self.l1(x)))))

    class TinyRes(chainer.Chain):
        def __init__(self):
            super().__init__()
            with self.init_scope():
                self.c1 = L.Convolution2D(3, 8, 3, pad=1)
                self.b1 = L.BatchNormalization(8)
                self.c2 = L.Convolution2D(8, 8, 3, pad=1)
                self.fc = L.Linear(8, 10)

        def __call__(self, x):
            h = F.relu(self.b1(self.c1(x)))
            h = F.relu(h + self.c2(h))
            return self.fc(F.average(h, axis=(2, 3)))

    class Res50(chainer.Chain):
        def __init__(self):
            super().__init__()
            from chainer.links.model.vision.resnet import ResNet50Layers
            with self.init_scope():
                self.net = ResNet50Layers(pretrained_model=None)

        def __call__(self, x):
            return self.net(x, layers=['fc6'])['fc6']

    rng = numpy.random.RandomState(0)
    if size == 'full':
        return {'mlp': (MLP(784, 1000, 10), rng.rand(128, 784).astype('f'), 128),
                'resnet': (Res50(), rng.rand(2, 3, 64, 64).astype('f'), 2)}
    return {'mlp': (MLP(64, 48, 10), rng.rand(8, 64).astype('f'), 8),
            'resnet': (TinyRes(), rng.rand(2, 3, 8, 8).astype('f'), 2)}


def worker(args):
    import chainer
    import chainer.functions as F
    import numpy
    from mpi4py import MPI

    import chainermn_comm
    from chainermn_train._overlap import BackwardOverlap

    comm = chainermn_comm.create_communicator('naive')
    mpi = MPI.COMM_WORLD
    out = {}
    for name, (model, x, batch) in _models(args.size).items():
        t = numpy.random.RandomState(comm.rank).randint(0, 10, size=batch).astype(numpy.int32)
        opt = chainer.optimizers.MomentumSGD(lr=1e-4)
        opt.setup(model)
        comm.bcast_data(model)
        overlap = BackwardOverlap(comm, model)
        grads_flat = {}

        def compute(mode):
            model.cleargrads()
            loss = F.softmax_cross_entropy(model(x), t)
            if mode == 'overlap':
                overlap.run_backward(loss)
            else:
                loss.backward()
                if mode == 'plain':
                    comm.multi_node_mean_grad(model, zero_fill=True)
            opt.update()

        def pack_unpack():
            gs = [p.grad for _, p in sorted(model.namedparams()) if p.grad is not None]
            n = sum(g.size for g in gs)
            buf = grads_flat.get(n)
            if buf is None:
                buf = grads_flat[n] = numpy.empty(n, numpy.float32)
            o = 0
            for g in gs:
                buf[o:o + g.size] = g.reshape(-1)
                o += g.size
            o = 0
            for g in gs:
                numpy.multiply(buf[o:o + g.size], 1.0 / comm.size, out=g.reshape(-1))
                o += g.size

        modes = {'plain': lambda: compute('plain'), 'overlap': lambda: compute('overlap'),
                 'compute': lambda: compute('compute'), 'pack_unpack': pack_unpack}
        times = {m: [] for m in modes}
        for i in range(args.warmup + args.iters):
            order = sorted(modes)
            random.Random(i).shuffle(order)
            for m in order:
                mpi.Barrier()
                t0 = time.perf_counter()
                modes[m]()
                dt = mpi.allreduce(time.perf_counter() - t0, op=MPI.MAX)
                if i >= args.warmup:
                    times[m].append(dt)
        med = {m: statistics.median(v) for m, v in times.items()}
        nbytes = sum(p.size * 4 for p in model.params())
        out['{}@{}'.format(name, comm.size)] = {
            'ranks': comm.size, 'grad_bytes': nbytes, 'iters': args.iters,
            'iteration_plain_s': med['plain'], 'iteration_overlap_s': med['overlap'],
            'compute_s': med['compute'], 'pack_unpack_s': med['pack_unpack'],
            'exposed_comm_plain_s': med['plain'] - med['compute'],
            'exposed_comm_overlap_s': med['overlap'] - med['compute'],
            'overlap_over_plain': med['overlap'] / med['plain'],
            'min_s': {m: min(v) for m, v in times.items()}}
        overlap.free()
    if comm.rank == 0:
        with open(args.out, 'w') as f:
            json.dump(out, f)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--ranks', default='1,2')
    p.add_argument('--size', choices=('tiny', 'full'), default='full')
    p.add_argument('--iters', type=int, default=None)
    p.add_argument('--warmup', type=int, default=1)
    p.add_argument('--out', default=os.path.join(HERE, 'iteration.json'))
    p.add_argument('--worker', action='store_true', help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.iters is None:
        args.iters = 15 if args.size == 'full' else 2
    if args.worker:
        return worker(args)
    mpiexec = os.path.join(os.path.dirname(sys.executable), 'mpiexec')
    # One BLAS thread per rank: with several ranks per machine, BLAS threads would fight the
    # ranks for the cores and the timings would measure that instead.
    env = dict(os.environ)
    for var in ('OPENBLAS_NUM_THREADS', 'OMP_NUM_THREADS', 'MKL_NUM_THREADS'):
        env.setdefault(var, '1')
    result = {}
    for n in [int(v) for v in args.ranks.split(',')]:
        part = args.out + '.part{}'.format(n)
        subprocess.run([mpiexec, '-n', str(n), sys.executable, os.path.abspath(__file__), '--worker',
                        '--size', args.size, '--iters', str(args.iters), '--warmup', str(args.warmup),
                        '--out', part], check=True, env=env)
        with open(part) as f:
            result.update(json.load(f))
        os.remove(part)
    with open(args.out, 'w') as f:
        json.dump(result, f, indent=1)
    print('{:<11s} {:>9s} {:>9s} {:>9s} {:>10s} {:>10s} {:>9s} {:>8s}'.format(
        'model@n', 'plain ms', 'overlap', 'compute', 'exp.plain', 'exp.ovl', 'pack/unp', 'ovl/pl'))
    for k, e in result.items():
        print('{:<11s} {:>9.1f} {:>9.1f} {:>9.1f} {:>10.1f} {:>10.1f} {:>9.1f} {:>8.3f}'.format(
            k, e['iteration_plain_s'] * 1e3, e['iteration_overlap_s'] * 1e3, e['compute_s'] * 1e3,
            e['exposed_comm_plain_s'] * 1e3, e['exposed_comm_overlap_s'] * 1e3,
            e['pack_unpack_s'] * 1e3, e['overlap_over_plain']))


if __name__ == '__main__':
    main()
