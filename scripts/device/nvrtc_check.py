"""Compile every batched pack/unpack kernel with NVRTC alone: no GPU and no CUDA driver needed.

Needs CuPy and NVRTC importable (e.g. ``pip install cupy-cuda13x "cuda-toolkit[nvrtc]==13.*"`` in a
scratch venv with NumPy 2).  Run: ``PYTHONPATH=packages/chainermn-comm/src python
scripts/device/nvrtc_check.py [--arch compute_90]``.  Exits 1 if any kernel fails to compile.
"""

import argparse
import itertools
import sys

import numpy

__all__ = ['main']


def main(argv=None):
    """Compile the kernel of every (source dtype, buffer dtype, direction) and report failures."""
    from cupy_backends.cuda.libs import nvrtc

    from chainermn_comm.gpu import _layout
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--arch', default='compute_90')
    args = ap.parse_args(argv)
    dtypes = [numpy.dtype(d) for d in ('float16', 'float32', 'float64')]
    failed = 0
    total = 0
    for src, dst, direction in itertools.product(dtypes, dtypes, ('pack', 'unpack')):
        total += 1
        code, name = _layout.pack_kernel_source(src, dst, direction)
        prog = nvrtc.createProgram(code, name + '.cu', (), ())
        try:
            nvrtc.compileProgram(prog, ['-arch=' + args.arch])
            ptx = nvrtc.getPTX(prog)
            ptx = ptx.decode() if isinstance(ptx, bytes) else ptx
            if '.entry ' + name not in ptx:
                raise RuntimeError('entry {} missing from the PTX'.format(name))
        except Exception as e:
            failed += 1
            print('FAILED {} {}->{} ({}): {}\n{}'.format(direction, src, dst, name, e,
                                                        nvrtc.getProgramLog(prog)))
        finally:
            nvrtc.destroyProgram(prog)
    print('NVRTC {}: {} of {} kernels compiled for {}'.format(
        '.'.join(map(str, nvrtc.getVersion())), total - failed, total, args.arch))
    return 1 if failed else 0


if __name__ == '__main__':
    sys.exit(main())
