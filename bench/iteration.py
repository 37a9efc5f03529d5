"""Whole training iterations (forward + backward + all-reduce + update) at several rank counts.

Usage: python bench/iteration.py [--ranks 1,2] [--size tiny|full] [--iters N] [--out FILE.json]
Prints per model and rank count: iteration time with the plain path (backward, then
multi_node_mean_grad) and with BackwardOverlap, compute-only time (same iteration
without communication), exposed communication (iteration minus compute-only), and the
pack/unpack cost of the same gradients (copy into one buffer and back, scaled).
"""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import peersite  # noqa: E402

peersite.enter()

import argparse  # noqa: E402
import json  # noqa: E402
import random  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402


def _models(size, batch=None):
    import chainer
    import chainer.functions as F
    import chainer.links as L
    import numpy

    class MLP(chainer.Chain):
        label = 'MLP'

        def __init__(self, n_in, n_units, n_out):
            super().__init__()
            with self.init_scope():
                self.l1 = L.Linear(n_in, n_units)
                self.l2 = L.Linear(n_units, n_units)
                self.l3 = L.Linear(n_units, n_out)

        def __call__(self, x):
            return self.l3(F.relu(self.l2(F.relu(self.l1(x)))))

    class TinyRes(chainer.Chain):
        label = 'tiny ResNet-style net'

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
        label = 'ResNet-50'

        def __init__(self):
            super().__init__()
            from chainer.links.model.vision.resnet import ResNet50Layers
            with self.init_scope():
                self.net = ResNet50Layers(pretrained_model=None)

        def __call__(self, x):
            return self.net(x, layers=['fc6'])['fc6']

    rng = numpy.random.RandomState(0)
    if size == 'full':
        return {'mlp': (MLP(784, 1000, 10), rng.rand(batch or 128, 784).astype('f'), batch or 128),
                'resnet': (Res50(), rng.rand(batch or 2, 3, 64, 64).astype('f'), batch or 2)}
    return {'mlp': (MLP(64, 48, 10), rng.rand(batch or 8, 64).astype('f'), batch or 8),
            'resnet': (TinyRes(), rng.rand(batch or 2, 3, 8, 8).astype('f'), batch or 2)}


MODES = ('plain', 'overlap', 'compute', 'pack_unpack', 'allreduce', 'plain_fp16', 'overlap_fp16',
         'allreduce_fp16', 'plain_auto', 'overlap_auto')
PEER_MODES = ('peer_plain', 'peer_allreduce', 'compute')
DEFAULT_MODES = 'plain,overlap,compute,pack_unpack'


def _communicators(args):
    """Return (comm, comm16 or None, BackwardOverlap or None, comm_auto or None): ours, or the peer's."""
    if args.peer:
        import chainermn
        if 'chainermn_comm' in sys.modules or not chainermn.__file__.endswith(
                os.path.join('site-packages', 'chainermn', '__init__.py')):
            raise SystemExit('peer run must use Chainer 7.8.1 bundled chainermn, got {}'
                             .format(chainermn.__file__))
        return chainermn.create_communicator('naive'), None, None, None
    import numpy

    import chainermn_comm
    from chainermn_train._overlap import BackwardOverlap
    comm16 = auto = None
    if any(m.endswith('_fp16') for m in args.modes.split(',')):
        comm16 = chainermn_comm.create_communicator('naive', allreduce_grad_dtype=numpy.float16)
    if any(m.endswith('_auto') for m in args.modes.split(',')):
        auto = chainermn_comm.create_communicator('naive', allreduce_grad_dtype='auto')
    return chainermn_comm.create_communicator('naive'), comm16, BackwardOverlap, auto


def _still_tuning(obj):
    """Return whether a communicator's plain average or a BackwardOverlap has not finished tuning."""
    tuning = getattr(obj, 'tuning', None)  # a BackwardOverlap's OverlapTuning
    if tuning is not None:
        return tuning.active and (tuning.tuner is None or tuning.tuner.tuning)
    tuned = getattr(obj, '_tuned', None)  # a communicator's TunedMean, made at its first average
    if tuned is None:
        return True
    active = getattr(tuned, 'active', getattr(tuned, '_active', False))   # '_active' before 2026-11-28
    return active and (tuned.tuning.tuner is None or tuned.tuning.tuner.tuning)


def worker(args):
    import chainer
    import chainer.functions as F
    import numpy
    from mpi4py import MPI

    comm, comm16, backward_overlap, comm_auto = _communicators(args)
    wanted = args.modes.split(',')
    known = PEER_MODES if args.peer else MODES
    bad = [m for m in wanted if m not in known]
    if bad:
        raise SystemExit('unknown modes {} for this run; choose from {}'.format(bad, ', '.join(known)))
    mpi = MPI.COMM_WORLD
    out = {}
    for name, (model, x, batch) in _models(args.size, args.batch).items():
        if args.models and name not in args.models.split(','):
            continue
        t = numpy.random.RandomState(comm.rank).randint(0, 10, size=batch).astype(numpy.int32)
        opt = chainer.optimizers.MomentumSGD(lr=1e-4)
        opt.setup(model)
        comm.bcast_data(model)
        overlaps = {}
        if 'overlap' in wanted:
            overlaps['overlap'] = backward_overlap(comm, model)
        if 'overlap_fp16' in wanted:
            overlaps['overlap_fp16'] = backward_overlap(comm16, model)
        if 'overlap_auto' in wanted:
            overlaps['overlap_auto'] = backward_overlap(comm_auto, model)
        grads_flat = {}

        def compute(mode):
            model.cleargrads()
            loss = F.softmax_cross_entropy(model(x), t)
            if mode in overlaps:
                overlaps[mode].run_backward(loss)
            else:
                loss.backward()
                if mode in ('plain', 'peer_plain'):
                    comm.multi_node_mean_grad(model, zero_fill=True)
                elif mode == 'plain_fp16':
                    comm16.multi_node_mean_grad(model, zero_fill=True)
                elif mode == 'plain_auto':
                    comm_auto.multi_node_mean_grad(model, zero_fill=True)
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

        def allreduce(c):
            # The average alone, on the gradients the last iteration left (every param has one).
            c.multi_node_mean_grad(model, zero_fill=True)

        special = {'pack_unpack': pack_unpack, 'allreduce': lambda: allreduce(comm),
                   'peer_allreduce': lambda: allreduce(comm),
                   'allreduce_fp16': lambda: allreduce(comm16)}
        modes = {m: special.get(m, lambda m=m: compute(m)) for m in wanted}
        compute('compute')  # every parameter has a gradient before an average-only mode runs
        # What tunes (our plain averages and overlaps) runs its first schedule now, timed apart,
        # so that the iterations below time what it chose.
        tuning = {}
        if not args.peer:
            owners = {'plain': comm, 'allreduce': comm, 'plain_fp16': comm16, 'allreduce_fp16': comm16,
                      'plain_auto': comm_auto}
            owners.update(overlaps)
            for m in sorted(m for m in modes if m in owners):
                spent = []
                while _still_tuning(owners[m]) and len(spent) < 60:
                    mpi.Barrier()
                    t0 = time.perf_counter()
                    modes[m]()
                    spent.append(mpi.allreduce(time.perf_counter() - t0, op=MPI.MAX))
                if spent:
                    tuning[m] = {'calls': len(spent), 'seconds': sum(spent), 'times_s': spent}
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
        e = {'model': model.label, 'ranks': comm.size, 'grad_bytes': nbytes, 'iters': args.iters, 'batch': batch,
             'input_shape': list(x.shape), 'median_s': med, 'times_s': times, 'tuning': tuning,
             'min_s': {m: min(v) for m, v in times.items()}}
        # The names the single-machine run has always written.
        for m, key in (('plain', 'iteration_plain_s'), ('overlap', 'iteration_overlap_s'),
                       ('compute', 'compute_s'), ('pack_unpack', 'pack_unpack_s')):
            if m in med:
                e[key] = med[m]
        if 'compute' in med:
            for m in med:
                if m in ('plain', 'overlap') or m.endswith('_plain') or m.startswith(('plain_', 'overlap_')):
                    e['exposed_comm_{}_s'.format(m)] = med[m] - med['compute']
        if 'plain' in med and 'overlap' in med:
            e['overlap_over_plain'] = med['overlap'] / med['plain']
        if 'overlap' in overlaps:
            e['overlap_mode'] = overlaps['overlap'].mode
        out['{}@{}'.format(name, comm.size)] = e
        for o in overlaps.values():
            o.free()
    if comm.rank == 0:
        with open(args.out, 'w') as f:
            json.dump(out, f)


def _passed(args):
    """Return the worker options that ``args`` sets beyond the defaults (batch, models, modes)."""
    out = []
    for opt in ('batch', 'models', 'modes'):
        v = getattr(args, opt)
        if v is not None:
            out += ['--' + opt, str(v)]
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--ranks', default='1,2')
    p.add_argument('--size', choices=('tiny', 'full'), default='full')
    p.add_argument('--iters', type=int, default=None)
    p.add_argument('--warmup', type=int, default=1)
    p.add_argument('--out', default=os.path.join(HERE, 'iteration.json'))
    p.add_argument('--batch', type=int, default=None, help='batch per rank (default: 128 MLP, 2 ResNet)')
    p.add_argument('--models', default=None, help='comma-separated: mlp, resnet (default both)')
    p.add_argument('--modes', default=DEFAULT_MODES,
                   help='worker only: comma-separated of ' + ', '.join(MODES + PEER_MODES[:2]))
    p.add_argument('--peer', action='store_true', help='worker only, under python -S: the peer')
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
                        '--out', part] + _passed(args), check=True, env=env)
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
