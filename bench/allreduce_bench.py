"""Gradient all-reduce benchmark; run on every rank under mpiexec (bench/run.sh drives it).

Modes:
  default  our communicators (chainermn_comm) next to the floors and references, interleaved;
  --peer   Chainer 7.8.1's bundled ``chainermn`` (naive) with this job's own floor and per-array
           contenders.  Start it with ``python -S``: the venv's site-packages is then added
           without its .pth files, so our editable packages are not importable and
           ``import chainermn`` resolves to the bundled copy (checked below).
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peersite  # noqa: E402

peersite.enter()

import argparse  # noqa: E402
import json  # noqa: E402
import random  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import numpy  # noqa: E402
from mpi4py import MPI  # noqa: E402

import gloo  # noqa: E402
import models  # noqa: E402
import probe  # noqa: E402
from report import OURS_MPI_ONLY  # noqa: E402

CHUNK = 4 * 1024 * 1024
OURS_FP16 = 'ours_naive_fp16_multi_node_mean_grad'


def _timeit(comm, fn, settle=0.0):
    if settle:
        # Leave the link idle first, so a shaper's token bucket (tbf) is full at every start.
        time.sleep(settle)
    comm.Barrier()
    t0 = time.perf_counter()
    fn()
    dt = time.perf_counter() - t0
    return comm.allreduce(dt, op=MPI.MAX)


def _grads(link):
    return [p.grad for _, p in sorted(link.namedparams())]


def _floor_contenders(comm, link):
    grads = _grads(link)
    total = sum(g.size for g in grads)
    flat = numpy.concatenate([g.reshape(-1) for g in grads])
    flat_b = numpy.empty_like(flat)
    per = [g.copy() for g in grads]
    scale = numpy.float32(1.0 / comm.Get_size())
    step = CHUNK // flat.itemsize

    def floor_one():
        comm.Allreduce(MPI.IN_PLACE, flat, MPI.SUM)

    def floor_chunked():
        for s in range(0, total, step):
            comm.Allreduce(MPI.IN_PLACE, flat[s:s + step], MPI.SUM)

    def per_array():
        for g in per:
            comm.Allreduce(MPI.IN_PLACE, g, MPI.SUM)

    def per_array_mean():
        for g in per:
            comm.Allreduce(MPI.IN_PLACE, g, MPI.SUM)
            numpy.multiply(g, scale, out=g)

    def memcopy():
        numpy.copyto(flat_b, flat)

    return {'floor_packed_one': floor_one, 'floor_packed_chunked': floor_chunked,
            'per_array_allreduce': per_array, 'per_array_allreduce_mean': per_array_mean,
            'memcopy_once': memcopy}


def _our_contenders(link, keep=lambda name: True):
    import chainermn_comm
    out = {}
    for name in chainermn_comm.COMMUNICATOR_NAMES:
        if not keep('ours_{}_multi_node_mean_grad'.format(name)):
            continue
        try:
            comm = chainermn_comm.create_communicator(name)
        except Exception:  # needs a GPU / NCCL: not runnable here
            continue
        out['ours_{}_multi_node_mean_grad'.format(name)] = (
            lambda c=comm: c.multi_node_mean_grad(link, zero_fill=True))
    if keep(OURS_FP16):
        half = chainermn_comm.create_communicator('naive', allreduce_grad_dtype=numpy.float16)
        out[OURS_FP16] = lambda c=half: c.multi_node_mean_grad(link, zero_fill=True)
    if not keep(OURS_MPI_ONLY):
        return out
    # The same communicator with the node-shared-memory path switched off (MPI messages only).
    # The path is chosen at the first call, so make that call while the switch is set.
    from chainermn_comm import _shm_reduce
    os.environ[_shm_reduce.SHM_ENV] = '0'
    try:
        mpi_only = chainermn_comm.create_communicator('naive')
        mpi_only.multi_node_mean_grad(link, zero_fill=True)
    finally:
        del os.environ[_shm_reduce.SHM_ENV]
    out[OURS_MPI_ONLY] = lambda c=mpi_only: c.multi_node_mean_grad(link, zero_fill=True)
    return out


def _peer_contenders(link):
    import chainermn
    site = os.path.realpath(os.path.dirname(os.path.dirname(chainermn.__file__)))
    ours = os.path.realpath(os.path.join(os.path.dirname(__file__), '..', 'packages'))
    if site.startswith(ours) or 'chainermn_comm' in sys.modules:
        raise SystemExit('peer run loaded our chainermn from {}; it must be Chainer\'s bundled copy'
                         .format(chainermn.__file__))
    try:
        import chainermn_comm  # noqa: F401
    except ImportError:
        pass
    else:
        raise SystemExit('peer run can import chainermn_comm; run it under python -S')
    comm = chainermn.create_communicator('naive')
    fn = getattr(comm, 'multi_node_mean_grad', None) or comm.allreduce_grad
    return {'peer_chainer781_naive_mean_grad': lambda: fn(link)}, chainermn.__file__


def run(args):
    comm = MPI.COMM_WORLD
    size = comm.Get_size()
    result = {'meta': {'n': size, 'size': args.size, 'rounds': args.rounds, 'warmup': args.warmup,
                       'mode': 'peer' if args.peer else 'ours', 'grad_scale': args.grad_scale,
                       'mpi': MPI.Get_library_version().strip(),
                       'chunk_bytes_floor': CHUNK, 'numpy': numpy.__version__,
                       'chunk_bytes_env': os.environ.get('CHAINERMN_CHUNK_BYTES')},
              'models': {}}
    result['meta']['cross_core_read_before'] = probe.cross_core_read(comm)
    only = set(args.only.split(',')) if args.only else None

    def keep(name):
        return only is None or name in only
    for model in args.models.split(','):
        shapes = models.param_shapes(model, args.size)
        link = models.make_link(shapes, seed=comm.Get_rank(), grad_scale=args.grad_scale)
        nbytes = sum(int(numpy.prod(s)) * 4 for _, s in shapes)
        cont = _floor_contenders(comm, link)
        if args.peer:
            peer, where = _peer_contenders(link)
            cont.update(peer)
            result['meta']['peer_module'] = where
        else:
            cont.update(_our_contenders(link, keep))
            if args.gloo and gloo.available():
                cont.update(gloo.contenders(comm, sum(int(numpy.prod(s)) for _, s in shapes)))
        cont = {n: fn for n, fn in cont.items() if keep(n)}
        names = sorted(cont)
        times = {n: [] for n in names}
        for r in range(args.warmup + args.rounds):
            order = list(names)
            random.Random(1000 + r).shuffle(order)  # same order on every rank
            for n in order:
                dt = _timeit(comm, cont[n], args.settle)
                if r >= args.warmup:
                    times[n].append(dt)
        entry = {'bytes': nbytes, 'arrays': len(shapes),
                 'params': sum(int(numpy.prod(s)) for _, s in shapes), 'contenders': {}}
        for n in names:
            med = statistics.median(times[n])
            mn = min(times[n])
            algbw = nbytes / med / 1e9
            entry['contenders'][n] = {
                'times_s': times[n], 'median_s': med, 'min_s': mn,
                'algbw_GBps': algbw, 'algbw_GBps_best': nbytes / mn / 1e9,
                'busbw_GBps': algbw * 2 * (size - 1) / size if size > 1 else 0.0}
        result['models'][model] = entry
        del link, cont
    result['meta']['cross_core_read_after'] = probe.cross_core_read(comm)
    if comm.Get_rank() == 0:
        with open(args.out, 'w') as f:
            json.dump(result, f, indent=1)


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument('--size', choices=('tiny', 'full'), default='full')
    p.add_argument('--rounds', type=int, default=None)
    p.add_argument('--warmup', type=int, default=2)
    p.add_argument('--models', default=','.join(models.MODELS))
    p.add_argument('--peer', action='store_true')
    p.add_argument('--only', default=None,
                   help='comma-separated contender names to run (default: all of this mode)')
    p.add_argument('--grad-scale', type=float, default=1.0,
                   help='standard deviation of the random gradients (real ones are often 1e-3..1e-6, '
                        'where float16 casts meet subnormals)')
    p.add_argument('--gloo', action='store_true',
                   help='add PyTorch gloo contenders when torch is importable (ours mode)')
    p.add_argument('--settle', type=float, default=0.0,
                   help='seconds of idle link before each timed call (a tbf shaper refills its burst)')
    p.add_argument('--out', required=True)
    args = p.parse_args()
    if args.rounds is None:
        args.rounds = 11 if args.size == 'full' else 3
    run(args)


if __name__ == '__main__':
    main()
