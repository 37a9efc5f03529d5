"""Gradient all-reduce benchmark; run on every rank under mpiexec (bench/run.sh drives it).

Modes:
  default  our communicators (chainermn_comm) next to the floors and references, interleaved:
           float32, float16, bfloat16 and 'auto' with their knobs tuned (the default), and the
           three wires with every knob at its default (ours_fixed_*).  Contenders that tune
           first run their schedule (timed apart: 'tuning'), so the rounds time what they chose;
           after the rounds, each lossy wire's error against the float64 mean ('precision');
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
OURS_BF16 = 'ours_naive_bf16_multi_node_mean_grad'
OURS_AUTO = 'ours_naive_auto_multi_node_mean_grad'
#: Ours with every knob at its default (CHAINERMN_TUNE=0), one per wire: the fixed configurations.
FIXED = {'ours_fixed_float32': None, 'ours_fixed_float16': numpy.float16, 'ours_fixed_bfloat16': 'bfloat16'}
#: The wire each of our contenders uses (for the precision check).
WIRES = {OURS_FP16: numpy.float16, OURS_BF16: 'bfloat16', 'ours_fixed_float16': numpy.float16,
         'ours_fixed_bfloat16': 'bfloat16'}


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


def _our_contenders(link, keep=lambda name: True, comms=None):
    """Return our contenders by name; ``comms`` (a dict) receives the communicator of each."""
    import chainermn_comm
    out = {}
    comms = {} if comms is None else comms
    for name in chainermn_comm.COMMUNICATOR_NAMES:
        if not keep('ours_{}_multi_node_mean_grad'.format(name)):
            continue
        try:
            comm = chainermn_comm.create_communicator(name)
        except Exception:  # needs a GPU / NCCL: not runnable here
            continue
        comms['ours_{}_multi_node_mean_grad'.format(name)] = comm
        out['ours_{}_multi_node_mean_grad'.format(name)] = (
            lambda c=comm: c.multi_node_mean_grad(link, zero_fill=True))
    for key, wire in ((OURS_FP16, numpy.float16), (OURS_BF16, 'bfloat16'), (OURS_AUTO, 'auto')):
        if keep(key):
            comm = comms[key] = chainermn_comm.create_communicator('naive', allreduce_grad_dtype=wire)
            out[key] = lambda c=comm: c.multi_node_mean_grad(link, zero_fill=True)
    for key, wire in FIXED.items():
        if keep(key):
            # The knobs are decided after the first call: make it while CHAINERMN_TUNE=0 is set.
            os.environ['CHAINERMN_TUNE'] = '0'
            try:
                comm = comms[key] = chainermn_comm.create_communicator('naive', allreduce_grad_dtype=wire)
                comm.multi_node_mean_grad(link, zero_fill=True)
            finally:
                del os.environ['CHAINERMN_TUNE']
            out[key] = lambda c=comm: c.multi_node_mean_grad(link, zero_fill=True)
    if not keep(OURS_MPI_ONLY):
        return out
    # The same communicator with the node-shared-memory path switched off (MPI messages only).
    # The path is chosen at the first call, so make that call while the switch is set.
    from chainermn_comm.reduce import node_shared as _shm_reduce
    os.environ[_shm_reduce.SHM_ENV] = '0'
    try:
        mpi_only = comms[OURS_MPI_ONLY] = chainermn_comm.create_communicator('naive')
        mpi_only.multi_node_mean_grad(link, zero_fill=True)
    finally:
        del os.environ[_shm_reduce.SHM_ENV]
    out[OURS_MPI_ONLY] = lambda c=mpi_only: c.multi_node_mean_grad(link, zero_fill=True)
    return out


def _tuner_of(comm):
    """Return the Tuner of ``comm``'s plain gradient average (None before its first call)."""
    tuned = getattr(comm, '_tuned', None)
    return None if tuned is None else tuned.tuning.tuner


def _pretune(comm, cont, comms, settle):
    """Run every tuning contender until its first schedule is done; return its calls and times.

    The schedule's calls are real averages, timed here (slowest rank) so that their cost can be
    compared with the steady time afterwards; the rounds then time the tuned configuration.
    """
    out = {}
    for name in sorted(comms):
        if name not in cont:
            continue
        times = []
        while len(times) < 100:
            tuner = _tuner_of(comms[name])
            if tuner is not None and not tuner.tuning:
                break
            times.append(_timeit(comm, cont[name], settle))
        tuner = _tuner_of(comms[name])
        if tuner is not None and times:
            out[name] = {'calls': len(times), 'times_s': times, 'seconds': sum(times),
                         'choice': {k: _label(v) for k, v in tuner.choice.items()},
                         'figures_s': tuner.history[-1][1] if tuner.history else {}}
    return out


def _label(value):
    from chainermn_comm.reduce import tune as _tune
    return _tune.label(value)


def _precision(comm, link, comms, cont):
    """Return, per lossy contender, the normwise relative error of one average against float64.

    Every rank sets its gradients to seeded values, averages them once with the contender, and
    compares with the exact mean (an all-reduce in float64).
    """
    grads = [p for _, p in sorted(link.namedparams())]
    rng = numpy.random.RandomState(77 + comm.Get_rank())
    mine = [rng.standard_normal(p.grad.shape).astype(numpy.float32) for p in grads]
    exact = []
    for g in mine:
        e = g.astype(numpy.float64)
        comm.Allreduce(MPI.IN_PLACE, e, MPI.SUM)
        exact.append(e / comm.Get_size())
    out = {}
    for name in sorted(n for n in cont if n in WIRES or n == OURS_AUTO):
        for p, g in zip(grads, mine):
            p.grad[...] = g
        cont[name]()
        num = sum(float(((p.grad - e) ** 2).sum()) for p, e in zip(grads, exact))
        den = sum(float((e ** 2).sum()) for e in exact)
        tuned = getattr(comms[name], '_tuned', None) if name in comms else None
        wire = WIRES[name] if name in WIRES else tuned.dtype if tuned is not None else None
        out[name] = {'rel_error_2norm': (num / den) ** 0.5 if den else 0.0, 'wire': _label(wire)}
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
    result = {'meta': {'n': size, 'size': args.size, 'rounds': args.rounds, 'calls': args.calls,
                       'warmup': args.warmup,
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
            comms = {}
            cont.update(_our_contenders(link, keep, comms))
            if args.gloo and gloo.available():
                cont.update(gloo.contenders(comm, sum(int(numpy.prod(s)) for _, s in shapes)))
        cont = {n: fn for n, fn in cont.items() if keep(n)}
        tuning = {} if args.peer else _pretune(comm, cont, comms, args.settle)
        names = sorted(cont)
        times = {n: [] for n in names}
        for r in range(args.warmup + args.rounds):
            order = list(names)
            random.Random(1000 + r).shuffle(order)  # same order on every rank
            for n in order:
                # The median of --calls calls back to back: one sample per contender and round.
                dt = statistics.median(_timeit(comm, cont[n], args.settle) for _ in range(args.calls))
                if r >= args.warmup:
                    times[n].append(dt)
        entry = {'bytes': nbytes, 'arrays': len(shapes),
                 'params': sum(int(numpy.prod(s)) for _, s in shapes), 'contenders': {}, 'tuning': tuning,
                 'precision': {} if args.peer else _precision(comm, link, comms, cont)}
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
    p.add_argument('--calls', type=int, default=1,
                   help="calls per contender and round; the round's sample is their median")
    p.add_argument('--out', required=True)
    args = p.parse_args()
    if args.rounds is None:
        args.rounds = 11 if args.size == 'full' else 3
    run(args)


if __name__ == '__main__':
    main()
