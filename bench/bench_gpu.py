"""Benchmark pack + all-reduce + unpack of a ResNet-50-sized gradient set on the GPU.

Run: ``mpiexec -n 1 python bench/bench_gpu.py [--comm pure_nccl] [--iters 20]``.
Reports the device's own device-to-device copy bandwidth, pack/unpack throughput (bytes read +
written per second, batched and per-array) as a fraction of it (target >= 70%), and the time of
a full allreduce_grad in float32 versus float16.
"""

import argparse
import json
import sys

import numpy

__all__ = ['resnet50_like_sizes', 'main']


def resnet50_like_sizes(n_arrays=161, total=25_557_032, seed=0):
    """Return ``n_arrays`` sizes summing to ``total``: a few big conv/fc weights and many small ones."""
    rng = numpy.random.RandomState(seed)
    weights = rng.lognormal(mean=0.0, sigma=2.0, size=n_arrays)
    sizes = numpy.maximum(64, (weights / weights.sum() * total).astype(numpy.int64))
    sizes[numpy.argmax(sizes)] += total - int(sizes.sum())
    return [int(s) for s in sizes]


def _time(cupy, fn, iters):
    fn()
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    end.synchronize()
    return cupy.cuda.get_elapsed_time(start, end) / 1000.0 / iters


class _Dev:
    pass


class _P:
    def __init__(self, a, g):
        self.array, self.grad = a, g
        self.device = _Dev()


class _M:
    def __init__(self, params):
        self.params = params

    def namedparams(self):
        return [('p{:03d}'.format(i), p) for i, p in enumerate(self.params)]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--comm', default='pure_nccl')
    ap.add_argument('--iters', type=int, default=20)
    ap.add_argument('--json', action='store_true', help='print one JSON object instead of text')
    args = ap.parse_args(argv)
    import cupy
    from chainermn_comm import create_communicator
    from chainermn_comm.gpu._kernels import GradPacker

    comm = create_communicator('naive')
    cupy.cuda.Device(comm.intra_rank % cupy.cuda.runtime.getDeviceCount()).use()
    sizes = resnet50_like_sizes()
    total = sum(sizes)
    grads = [cupy.random.standard_normal(s, dtype=numpy.float32) for s in sizes]
    out = {'arrays': len(sizes), 'elements': total, 'device': cupy.cuda.runtime.getDeviceProperties(
        cupy.cuda.runtime.getDevice())['name'].decode(errors='replace')}

    src = cupy.empty(total, numpy.float32)
    dst = cupy.empty_like(src)
    t = _time(cupy, lambda: cupy.cuda.runtime.memcpyAsync(
        dst.data.ptr, src.data.ptr, src.nbytes, cupy.cuda.runtime.memcpyDeviceToDevice,
        cupy.cuda.get_current_stream().ptr), args.iters)
    copy_bw = 2 * src.nbytes / t
    out['d2d_copy_GBps'] = copy_bw / 1e9

    for batched in (True, False):
        for buf_dtype in (numpy.float32, numpy.float16):
            p = GradPacker(batched=batched)
            plan = p.plan(grads, buf_dtype)
            buf = p.buffer(buf_dtype, plan.layout.padded)
            moved = total * (4 + numpy.dtype(buf_dtype).itemsize)
            tp = _time(cupy, lambda: p.pack(grads, buf, plan, 0.5), args.iters)
            tu = _time(cupy, lambda: p.unpack(buf, grads, plan, 2.0), args.iters)
            tag = '{}_{}'.format('batched' if batched else 'per_array', numpy.dtype(buf_dtype).name)
            out[tag] = {'pack_ms': tp * 1e3, 'unpack_ms': tu * 1e3,
                        'pack_GBps': moved / tp / 1e9, 'unpack_GBps': moved / tu / 1e9,
                        'pack_vs_copy': moved / tp / copy_bw, 'unpack_vs_copy': moved / tu / copy_bw}

    for dtype in (numpy.float32, numpy.float16):
        c = create_communicator(args.comm, allreduce_grad_dtype=dtype, batched_copy=True)
        model = _M([_P(g, g) for g in grads])
        t = _time(cupy, lambda: c.allreduce_grad(model), args.iters)
        out['allreduce_grad_{}_{}_ms'.format(args.comm, numpy.dtype(dtype).name)] = t * 1e3
    f32 = out['allreduce_grad_{}_float32_ms'.format(args.comm)]
    f16 = out['allreduce_grad_{}_float16_ms'.format(args.comm)]
    out['fp16_over_fp32_time'] = f16 / f32
    out['target_met'] = min(out['batched_float32']['pack_vs_copy'],
                            out['batched_float32']['unpack_vs_copy']) >= 0.7
    if comm.rank == 0:
        if args.json:
            print(json.dumps(out, indent=1, sort_keys=True))
        else:
            for k, v in sorted(out.items()):
                print('{:40s} {}'.format(k, v))
    sys.stdout.flush()
    return 0


if __name__ == '__main__':
    sys.exit(main())
