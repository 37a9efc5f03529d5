"""PowerSGD on one GPU: compression and decompression of the ResNet-50 gradient set (issue 45).

Usage: mpiexec -n 1 python bench/hooks_gpu.py [--rank 4] [--iters 20] [--json]
Times, with CUDA events on the current stream, PowerSGD's own compute per update (error feedback,
``P = M Q``, the batched orthogonalisation, ``Q = M^T P``, ``P Q^T`` and the new error memory) on
the ResNet-50 gradient set of bench/models.py as CuPy arrays, at one rank (the all-reduces of one
rank move nothing), and the whole hook call for comparison.  The issue's target: compression and
decompression under 2 ms on one H100.  Runs on the NumPy stand-in for CuPy too (figures then mean
nothing).
"""

import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import models  # noqa: E402


class _Device:
    def __init__(self):
        import cupy
        self.xp = cupy


class _Param:
    """What the hooked average reads of a parameter: its array, gradient and device."""

    def __init__(self, grad):
        self.array = grad
        self.grad = grad.copy()
        self.device = _Device()


class _Model:
    def __init__(self, params):
        self._params = params

    def namedparams(self):
        return list(self._params.items())


def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--rank', type=int, default=4)
    p.add_argument('--iters', type=int, default=20)
    p.add_argument('--comm', default='pure_nccl')
    p.add_argument('--json', action='store_true')
    args = p.parse_args()
    import cupy
    import numpy

    import chainermn_comm
    from chainermn_comm import hooks, trace
    comm = chainermn_comm.create_communicator(args.comm)
    shapes = models.param_shapes('resnet50', 'full')
    rng = numpy.random.RandomState(0)
    link = _Model({name: _Param(cupy.asarray(rng.standard_normal(shape).astype(numpy.float32)))
                   for name, shape in shapes})
    hook = hooks.PowerSGD(rank=args.rank, start_update=0)
    parts = {}
    stream = cupy.cuda.get_current_stream()
    whole = []
    for i in range(args.iters + 2):
        events = {}

        def begin(device=False, events=events):
            e = cupy.cuda.Event()
            e.record(stream)
            return e

        def finish(token, name, cat, args_=None, track=None, events=events):
            if cat != 'compute':  # the hook's own compute only (not the all-reduces' device time)
                return
            e = cupy.cuda.Event()
            e.record(stream)
            events.setdefault(name, []).append((token, e))

        trace.ON, trace.begin, trace.end = True, begin, finish
        try:
            t0 = cupy.cuda.Event()
            t0.record(stream)
            hooks.mean_model(comm, link, hook)
            t1 = cupy.cuda.Event()
            t1.record(stream)
            t1.synchronize()
        finally:
            trace.ON = False
        if i >= 2:
            whole.append(cupy.cuda.get_elapsed_time(t0, t1))
            for name, pairs in events.items():
                parts.setdefault(name, []).append(sum(cupy.cuda.get_elapsed_time(a, b) for a, b in pairs))
    med = {k: statistics.median(v) for k, v in parts.items() if v}
    compute = sum(med.values())
    out = {'device': cupy.cuda.runtime.getDeviceProperties(0)['name'].decode()
           if hasattr(cupy.cuda.runtime.getDeviceProperties(0)['name'], 'decode')
           else str(cupy.cuda.runtime.getDeviceProperties(0)['name']),
           'rank': args.rank, 'arrays': len(shapes), 'elements': int(sum(numpy.prod(s) for _, s in shapes)),
           'compressed': hook.last.get('compressed'), 'parts_ms': med, 'compress_decompress_ms': compute,
           'whole_call_ms': statistics.median(whole), 'target_ms': 2.0}
    if args.json:
        print(json.dumps(out))
    else:
        print('PowerSGD rank {} on {}: compression and decompression {:.2f} ms per update ({}); the whole '
              'hook call {:.2f} ms; target < 2 ms'.format(
                  args.rank, out['device'], compute, ', '.join('{} {:.2f}'.format(k, v) for k, v in med.items()),
                  out['whole_call_ms']))


if __name__ == '__main__':
    main()
