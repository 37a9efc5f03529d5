"""Pack CuPy arrays into one persistent device buffer (cast and scale fused) and back."""

import numpy

from chainermn_comm.gpu import _layout

__all__ = ['GradPacker', 'cast_scale', 'BLOCK_THREADS', 'MAX_BLOCKS']

#: Threads per block of the batched kernel.
BLOCK_THREADS = 256
#: Upper bound on blocks of one launch (blocks stride over the tile table).
MAX_BLOCKS = 65535

_raw_kernels = {}
_elementwise = {}

_CNAME = {'float16': 'float16', 'float32': 'float', 'float64': 'double'}


def _raw_kernel(src_dtype, dst_dtype, direction):
    key = (_layout.dtype_name(src_dtype), _layout.dtype_name(dst_dtype), direction)
    k = _raw_kernels.get(key)
    if k is None:
        import cupy
        code, name = _layout.pack_kernel_source(src_dtype, dst_dtype, direction)
        k = cupy.RawKernel(code, name)
        _raw_kernels[key] = k
    return k


def _cast_scale_kernel(src_dtype, dst_dtype):
    """Return an ElementwiseKernel ``y = (D)((W)x * s)`` for one (possibly strided) array.

    A bfloat16 side (uint16 words) reads and writes through the ``DEVICE_CODECS`` functions.
    """
    s = _layout.dtype_name(src_dtype)
    d = _layout.dtype_name(dst_dtype)
    key = (s, d)
    k = _elementwise.get(key)
    if k is None:
        import cupy
        _layout.ctype_of(s), _layout.ctype_of(d)
        wide = 'float64' if 'float64' in key else 'float32'
        wc = 'double' if wide == 'float64' else 'float'
        bf = _layout.BFLOAT16
        if bf in key:
            if d == bf:
                op = 'y = {}'.format(_layout.store_expr(bf, '({})x * s'.format(wc)))
            else:
                op = 'y = ({})(chainermn_bf2f(x) * s)'.format(_CNAME[d])
            k = cupy.ElementwiseKernel(
                '{} x, {} s'.format('uint16' if s == bf else s, wide),
                '{} y'.format('uint16' if d == bf else d), op,
                'chainermn_cast_scale_{}_{}'.format(s, d), preamble=_layout.DEVICE_CODECS)
        else:
            k = cupy.ElementwiseKernel(
                '{} x, {} s'.format(s, wide), '{} y'.format(d),
                'y = ({})(({})x * s)'.format(_CNAME[d], wc),
                'chainermn_cast_scale_{}_{}'.format(s, d))
        _elementwise[key] = k
    return k


def cast_scale(src, dst, scale=1.0, src_name=None, dst_name=None):
    """Write device ``src * scale`` into ``dst``; ``*_name`` says a side is the bfloat16 wire."""
    s = src_name or src.dtype
    d = dst_name or dst.dtype
    _cast_scale_kernel(s, d)(src, _scalar((s, d), scale), dst)
    return dst


def _scalar(dtype_pair, scale):
    wide = numpy.float64 if any(_layout.dtype_name(t) == 'float64' for t in dtype_pair) else numpy.float32
    return wide(scale)


class _Plan:
    """Device-side tables of one layout: tile tables per source dtype and the pointer table."""

    __slots__ = ('layout', 'groups', 'strided', 'ptrs_host', 'ptrs_dev', 'buf_name')

    def __init__(self, layout, groups, strided, buf_name=None):
        self.buf_name = buf_name  # the buffer's dtype name ('bfloat16' for its uint16 words)
        self.layout = layout
        self.groups = groups      # [(src dtype, device tiles, n_tiles)]
        self.strided = strided    # indices packed one by one (not C-contiguous)
        self.ptrs_host = None
        self.ptrs_dev = None


class GradPacker:
    """Pack arrays into a reused device buffer and unpack them, in one launch when ``batched``."""

    def __init__(self, batched=False, tile=_layout.TILE_ELEMS):
        self.batched = bool(batched)
        self.tile = int(tile)
        self._buffers = {}
        self._plans = {}
        #: Kernel launches of the last pack or unpack (for tests and benchmarks).
        self.last_launches = 0

    def buffer(self, dtype, n, slot='grad'):
        """Return a persistent device buffer of at least ``n`` elements of ``dtype`` (first ``n`` used).

        A ``'bfloat16'`` buffer holds uint16 words.
        """
        import cupy
        dt = _layout.storage_dtype(dtype)
        key = (slot, _layout.dtype_name(dtype))
        buf = self._buffers.get(key)
        if buf is None or buf.size < n or buf.device.id != cupy.cuda.runtime.getDevice():
            buf = cupy.empty(max(int(n), 1), dtype=dt)
            self._buffers[key] = buf
        return buf[:n]

    def release(self):
        """Drop the persistent buffers and tables."""
        self._buffers.clear()
        self._plans.clear()

    def plan(self, arrays, buf_dtype, align=1):
        """Return the (cached) _Plan for ``arrays`` packed into a ``buf_dtype`` buffer."""
        key = (_layout.dtype_name(buf_dtype), int(align),
               tuple((a.size, a.dtype.str, bool(a.flags.c_contiguous)) for a in arrays))
        plan = self._plans.get(key)
        if plan is None:
            plan = self._make_plan(arrays, align)
            plan.buf_name = key[0]
            if len(self._plans) > 64:
                self._plans.clear()
            self._plans[key] = plan
        return plan

    def _make_plan(self, arrays, align):
        import cupy
        layout = _layout.plan_layout([a.size for a in arrays], align=align, tile=self.tile)
        strided = [i for i, a in enumerate(arrays) if not a.flags.c_contiguous]
        groups = []
        if self.batched and layout.tiles.shape[0]:
            kinds = numpy.array([_dtype_code(a.dtype) for a in arrays], dtype=numpy.int64)
            contiguous = numpy.array([a.flags.c_contiguous for a in arrays], dtype=bool)
            row_kind = kinds[layout.tiles[:, 0]]
            row_ok = contiguous[layout.tiles[:, 0]]
            for code in sorted(set(kinds.tolist())):
                rows = layout.tiles[(row_kind == code) & row_ok]
                if rows.shape[0]:
                    groups.append((_SUPPORTED[code], cupy.asarray(numpy.ascontiguousarray(rows)),
                                   int(rows.shape[0])))
        return _Plan(layout, groups, strided)

    def _pointers(self, plan, arrays):
        import cupy
        ptrs = numpy.array([a.data.ptr for a in arrays], dtype=numpy.uint64)
        if plan.ptrs_dev is None or plan.ptrs_host is None or not numpy.array_equal(ptrs, plan.ptrs_host):
            if plan.ptrs_dev is None or plan.ptrs_dev.size != ptrs.size:
                plan.ptrs_dev = cupy.asarray(ptrs)
            else:
                plan.ptrs_dev.set(ptrs)
            plan.ptrs_host = ptrs
        return plan.ptrs_dev

    def pack(self, arrays, buf, plan, scale=1.0):
        """Write ``arrays`` (times ``scale``, cast to ``buf.dtype``) into ``buf`` as ``plan`` says."""
        layout = plan.layout
        if buf.size < layout.padded:
            raise ValueError('pack buffer holds {} elements but the layout needs {}'.format(
                buf.size, layout.padded))
        launches = 0
        if layout.padded > layout.total:
            buf[layout.total:layout.padded].fill(0)
            launches += 1
        launches += self._copy('pack', buf, arrays, plan, scale)
        self.last_launches = launches
        return buf

    def unpack(self, buf, arrays, plan, scale=1.0):
        """Write ``buf`` (times ``scale``, cast back) into ``arrays`` as ``plan`` says."""
        launches = self._copy('unpack', buf, arrays, plan, scale)
        self.last_launches = launches
        return arrays

    def _copy(self, direction, buf, arrays, plan, scale):
        """Copy between ``arrays`` and ``buf`` ('pack' or 'unpack'); return the kernel launches."""
        launches = 0
        if self.batched:
            if plan.groups:
                ptrs = self._pointers(plan, arrays)
                for src_dtype, tiles, n_tiles in plan.groups:
                    self._launch(src_dtype, plan.buf_name or buf.dtype, direction, ptrs, tiles, n_tiles,
                                 scale, buf)
                    launches += 1
            todo = plan.strided
        else:
            todo = range(len(arrays))
        for i in todo:
            a = arrays[i]
            if a.size == 0:
                continue
            off = int(plan.layout.offsets[i])
            view = buf[off:off + a.size].reshape(a.shape)
            bname = plan.buf_name or buf.dtype
            factor = _scalar((a.dtype, bname), scale)
            if direction == 'pack':
                _cast_scale_kernel(a.dtype, bname)(a, factor, view)
            else:
                _cast_scale_kernel(bname, a.dtype)(view, factor, a)
            launches += 1
        return launches

    def _launch(self, src_dtype, buf_dtype, direction, ptrs, tiles, n_tiles, scale, buf):
        kernel = _raw_kernel(src_dtype, buf_dtype, direction)
        blocks = min(n_tiles, MAX_BLOCKS)
        kernel((blocks,), (BLOCK_THREADS,),
               (ptrs, tiles, numpy.int64(n_tiles), numpy.float64(scale), buf))


_SUPPORTED = {i: dt for i, dt in enumerate(_layout.SUPPORTED_FLOATS)}


def _dtype_code(dtype):
    dt = numpy.dtype(dtype)
    for code, sup in _SUPPORTED.items():
        if sup == dt:
            return code
    raise TypeError('GPU gradient packing supports float16, float32 and float64 arrays; got {}'.format(dt))
