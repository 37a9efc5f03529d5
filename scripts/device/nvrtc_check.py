"""Compile every batched pack/unpack kernel with NVRTC alone: no GPU and no CUDA driver needed.

Needs NVRTC: CuPy's binding when CuPy is importable (e.g. ``pip install cupy-cuda13x
"cuda-toolkit[nvrtc]==13.*"`` in a scratch venv with NumPy 2), else ``libnvrtc`` found by ctypes
(``pip install --target DIR nvidia-cuda-nvrtc`` and ``--nvrtc DIR/nvidia/cu13/lib/libnvrtc.so.13``).
Run: ``PYTHONPATH=packages/chainermn-comm/src python scripts/device/nvrtc_check.py [--arch compute_90]``.
Compiles the kernels of every (source dtype, buffer dtype, direction), the buffer being float16,
float32, float64 or the bfloat16 wire, and the cast-and-scale functions of the element-wise
kernels (``_layout.DEVICE_CODECS``).  Exits 1 if any fails to compile.
"""

import argparse
import ctypes
import glob
import itertools
import os
import sys

import numpy

__all__ = ['main']


class _CtypesNvrtc:
    """The few NVRTC calls this check needs, through ctypes (no CuPy)."""

    def __init__(self, path):
        # NVRTC opens libnvrtc-builtins by name: load the one beside it first (no LD_LIBRARY_PATH).
        folder = os.path.dirname(os.path.abspath(path))
        for builtins in sorted(glob.glob(os.path.join(folder, 'libnvrtc-builtins.so*'))):
            if '.alt.' not in builtins:
                ctypes.CDLL(builtins, mode=ctypes.RTLD_GLOBAL)
        self.lib = ctypes.CDLL(path)

    def _ok(self, status, what):
        if status != 0:
            self.lib.nvrtcGetErrorString.restype = ctypes.c_char_p
            raise RuntimeError('{}: {}'.format(what, self.lib.nvrtcGetErrorString(status).decode()))

    def compile(self, code, name, arch):
        prog = ctypes.c_void_p()
        self._ok(self.lib.nvrtcCreateProgram(ctypes.byref(prog), code.encode(), (name + '.cu').encode(),
                                             0, None, None), 'nvrtcCreateProgram')
        try:
            opts = (ctypes.c_char_p * 1)(('-arch=' + arch).encode())
            status = self.lib.nvrtcCompileProgram(prog, 1, opts)
            if status != 0:
                size = ctypes.c_size_t()
                self.lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
                log = ctypes.create_string_buffer(size.value)
                self.lib.nvrtcGetProgramLog(prog, log)
                raise RuntimeError('compile failed:\n' + log.value.decode(errors='replace'))
            size = ctypes.c_size_t()
            self._ok(self.lib.nvrtcGetPTXSize(prog, ctypes.byref(size)), 'nvrtcGetPTXSize')
            ptx = ctypes.create_string_buffer(size.value)
            self._ok(self.lib.nvrtcGetPTX(prog, ptx), 'nvrtcGetPTX')
            return ptx.value.decode()
        finally:
            self.lib.nvrtcDestroyProgram(ctypes.byref(prog))

    def version(self):
        major, minor = ctypes.c_int(), ctypes.c_int()
        self.lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
        return major.value, minor.value


class _CupyNvrtc:
    """The same calls through CuPy's NVRTC binding."""

    def __init__(self):
        from cupy_backends.cuda.libs import nvrtc
        self.nvrtc = nvrtc

    def compile(self, code, name, arch):
        nvrtc = self.nvrtc
        prog = nvrtc.createProgram(code, name + '.cu', (), ())
        try:
            try:
                nvrtc.compileProgram(prog, ['-arch=' + arch])
            except Exception as e:
                raise RuntimeError('{}\n{}'.format(e, nvrtc.getProgramLog(prog)))
            ptx = nvrtc.getPTX(prog)
            return ptx.decode() if isinstance(ptx, bytes) else ptx
        finally:
            nvrtc.destroyProgram(prog)

    def version(self):
        return self.nvrtc.getVersion()


def _codec_probe():
    """Return (source, name) of a kernel that calls every device codec function once."""
    from chainermn_comm.gpu import _layout
    name = 'chainermn_codec_probe'
    body = r'''
extern "C" __global__ void NAME(const float *x, unsigned short *h, unsigned short *b, float *y, long long n) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < n) {
        h[i] = chainermn_f2h(x[i]);
        b[i] = chainermn_f2bf(x[i]);
        y[i] = chainermn_h2f(h[i]) + chainermn_bf2f(b[i]);
    }
}
'''.replace('NAME', name)
    return _layout.DEVICE_CODECS + body, name


def main(argv=None):
    """Compile every kernel and report failures; return the exit status."""
    from chainermn_comm.gpu import _layout
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--arch', default='compute_90')
    ap.add_argument('--nvrtc', default=None, help='path of libnvrtc.so (default: CuPy\'s binding)')
    args = ap.parse_args(argv)
    nv = _CtypesNvrtc(args.nvrtc) if args.nvrtc else _CupyNvrtc()
    sources = [numpy.dtype(d) for d in ('float16', 'float32', 'float64')]
    buffers = sources + [_layout.BFLOAT16]
    jobs = [_layout.pack_kernel_source(src, dst, direction)
            for src, dst, direction in itertools.product(sources, buffers, ('pack', 'unpack'))]
    jobs.append(_codec_probe())
    failed = 0
    for code, name in jobs:
        try:
            ptx = nv.compile(code, name, args.arch)
            if '.entry ' + name not in ptx:
                raise RuntimeError('entry {} missing from the PTX'.format(name))
        except Exception as e:
            failed += 1
            print('FAILED {}: {}'.format(name, e))
    print('NVRTC {}: {} of {} kernels compiled for {}'.format(
        '.'.join(map(str, nv.version())), len(jobs) - failed, len(jobs), args.arch))
    return 1 if failed else 0


if __name__ == '__main__':
    sys.exit(main())
