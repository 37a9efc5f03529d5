"""Pure (NumPy-only) planning for GPU gradient packing: offsets, tiles, padding, kernel source."""

import numpy

__all__ = ['GradLayout', 'plan_layout', 'padded_size', 'rank_position', 'ctype_of', 'dtype_name',
           'storage_dtype', 'pack_kernel_source', 'TILE_ELEMS', 'SUPPORTED_FLOATS', 'BFLOAT16',
           'DEVICE_CODECS', 'load_expr', 'store_expr']

#: Elements handled by one thread block of the batched pack/unpack kernel.
TILE_ELEMS = 8192

#: Floating dtypes gradients may be packed from or into.
SUPPORTED_FLOATS = (numpy.dtype(numpy.float16), numpy.dtype(numpy.float32), numpy.dtype(numpy.float64))

#: The bfloat16 wire: packed buffers hold its 16-bit words as uint16 (CuPy has no bfloat16 dtype).
BFLOAT16 = 'bfloat16'

_STORAGE = {'float16': 'unsigned short', 'float32': 'float', 'float64': 'double',
            BFLOAT16: 'unsigned short'}

#: Device functions of the kernels: float16 through PTX ``cvt`` (no CUDA header needed);
#: bfloat16 as the upper 16 bits of a float32, rounded to nearest even (NaN stays a quiet NaN).
DEVICE_CODECS = r'''
__device__ __forceinline__ unsigned short chainermn_f2h(float f) {
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}
__device__ __forceinline__ float chainermn_h2f(unsigned short h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}
__device__ __forceinline__ unsigned short chainermn_f2bf(float f) {
    unsigned int u;
    asm("mov.b32 %0, %1;" : "=r"(u) : "f"(f));
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        return (unsigned short)(((u >> 16) & 0x8000u) | 0x7fc0u);
    }
    u += 0x7fffu + ((u >> 16) & 1u);
    return (unsigned short)(u >> 16);
}
__device__ __forceinline__ float chainermn_bf2f(unsigned short h) {
    float f;
    unsigned int u = ((unsigned int)h) << 16;
    asm("mov.b32 %0, %1;" : "=f"(f) : "r"(u));
    return f;
}
'''


def dtype_name(dtype):
    """Return the name of a gradient or buffer dtype: a NumPy float name, or ``'bfloat16'``."""
    if isinstance(dtype, str) and dtype.strip().lower() == BFLOAT16:
        return BFLOAT16
    if getattr(dtype, 'name', None) == BFLOAT16 or getattr(dtype, '__name__', None) == BFLOAT16:
        return BFLOAT16
    return numpy.dtype(dtype).name


def storage_dtype(dtype):
    """Return the NumPy dtype a buffer of ``dtype`` is allocated with (uint16 for bfloat16)."""
    return numpy.dtype(numpy.uint16) if dtype_name(dtype) == BFLOAT16 else numpy.dtype(dtype)


class GradLayout:
    """Where each array lives in one packed buffer, and the tile table of the batched kernel.

    ``offsets[i]`` is the element offset of array ``i``; ``total`` the packed element count;
    ``padded`` the buffer length rounded up to a multiple of ``align`` (for reduce-scatter);
    ``tiles`` an int64 array of rows ``(array index, start in array, length, buffer offset)``.
    """

    __slots__ = ('sizes', 'offsets', 'total', 'padded', 'tiles', 'align')

    def __init__(self, sizes, offsets, total, padded, tiles, align):
        self.sizes = sizes
        self.offsets = offsets
        self.total = total
        self.padded = padded
        self.tiles = tiles
        self.align = align


def padded_size(total, align):
    """Return ``total`` rounded up to a multiple of ``align`` (at least ``align`` when total is 0)."""
    align = int(align)
    if align < 1:
        raise ValueError('align must be >= 1; got {}'.format(align))
    n = -(-int(total) // align) * align
    return max(n, align)


def plan_layout(sizes, align=1, tile=TILE_ELEMS):
    """Return the GradLayout packing arrays of ``sizes`` elements back to back."""
    sizes = numpy.asarray(list(sizes), dtype=numpy.int64).reshape(-1)
    if (sizes < 0).any():
        raise ValueError('array sizes must be non-negative; got {}'.format(sizes.tolist()))
    if tile < 1:
        raise ValueError('tile must be >= 1; got {}'.format(tile))
    offsets = numpy.zeros(len(sizes), dtype=numpy.int64)
    if len(sizes):
        numpy.cumsum(sizes[:-1], out=offsets[1:])
    total = int(sizes.sum()) if len(sizes) else 0
    counts = -(-sizes // tile)  # tiles per array (0 for empty arrays)
    n_tiles = int(counts.sum())
    tiles = numpy.empty((n_tiles, 4), dtype=numpy.int64)
    if n_tiles:
        idx = numpy.repeat(numpy.arange(len(sizes), dtype=numpy.int64), counts)
        first = numpy.zeros(len(sizes), dtype=numpy.int64)
        numpy.cumsum(counts[:-1], out=first[1:])
        within = numpy.arange(n_tiles, dtype=numpy.int64) - numpy.repeat(first, counts)
        start = within * tile
        tiles[:, 0] = idx
        tiles[:, 1] = start
        tiles[:, 2] = numpy.minimum(tile, sizes[idx] - start)
        tiles[:, 3] = offsets[idx] + start
    return GradLayout(sizes, offsets, total, padded_size(total, align), tiles, int(align))


def rank_position(hosts, rank):
    """Return (node id, intra rank) of ``rank`` given every rank's host key (first-seen node order)."""
    order = []
    for h in hosts:
        if h not in order:
            order.append(h)
    key = hosts[rank]
    return order.index(key), sum(1 for r in range(rank) if hosts[r] == key)


def ctype_of(dtype):
    """Return the C storage type the batched kernel uses for ``dtype`` (16-bit formats as raw bits)."""
    try:
        return _STORAGE[dtype_name(dtype)]
    except (KeyError, TypeError):
        raise ValueError('GPU gradient packing supports float16, float32 and float64 (and the '
                         'bfloat16 wire); got {}'.format(dtype))


def load_expr(name, expr, work):
    """Return C code reading ``expr`` of type ``name`` as ``work`` (float or double)."""
    if name == 'float16':
        return '({})chainermn_h2f({})'.format(work, expr)
    if name == BFLOAT16:
        return '({})chainermn_bf2f({})'.format(work, expr)
    return '({})({})'.format(work, expr)


def store_expr(name, expr):
    """Return C code turning ``expr`` into a value of type ``name`` (its storage type)."""
    if name == 'float16':
        return 'chainermn_f2h((float)({}))'.format(expr)
    if name == BFLOAT16:
        return 'chainermn_f2bf((float)({}))'.format(expr)
    return '({})({})'.format(_STORAGE[name], expr)


def pack_kernel_source(src_dtype, dst_dtype, direction):
    """Return (CUDA source, kernel name) of the batched kernel between arrays and a packed buffer.

    ``direction`` is ``'pack'`` (arrays of ``src_dtype`` into a buffer of ``dst_dtype``) or
    ``'unpack'`` (buffer of ``dst_dtype`` into arrays of ``src_dtype``).  The kernel takes
    ``(ptrs, tiles, n_tiles, scale, buf)``; block ``b`` handles tiles ``b, b + gridDim.x, ...``.
    Half precision goes through PTX ``cvt`` and bfloat16 through integer rounding (``DEVICE_CODECS``),
    so no CUDA header is needed.
    """
    ctype_of(src_dtype), ctype_of(dst_dtype)
    s, d = dtype_name(src_dtype), dtype_name(dst_dtype)
    if s == BFLOAT16:
        raise ValueError('bfloat16 is a wire format only: gradients must be float16, float32 or float64')
    if direction not in ('pack', 'unpack'):
        raise ValueError("direction must be 'pack' or 'unpack'; got {!r}".format(direction))
    work = 'double' if 'float64' in (s, d) else 'float'
    name = 'chainermn_{}_{}_{}'.format(direction, s, d)
    if direction == 'pack':
        body = 'buf[o + j] = {};'.format(store_expr(d, '{} * ({})scale'.format(
            load_expr(s, 'arr[st + j]', work), work)))
        arr_decl = 'const {} *arr = (const {} *)ptrs[a];'.format(ctype_of(s), ctype_of(s))
        buf_decl = '{} *buf'.format(ctype_of(d))
    else:
        body = 'arr[st + j] = {};'.format(store_expr(s, '{} * ({})scale'.format(
            load_expr(d, 'buf[o + j]', work), work)))
        arr_decl = '{} *arr = ({} *)ptrs[a];'.format(ctype_of(s), ctype_of(s))
        buf_decl = 'const {} *buf'.format(ctype_of(d))
    src = DEVICE_CODECS + r'''
extern "C" __global__ void NAME(const unsigned long long *ptrs, const long long *tiles,
                                long long n_tiles, double scale, BUF_DECL) {
    for (long long t = blockIdx.x; t < n_tiles; t += gridDim.x) {
        const long long a = tiles[4 * t];
        const long long st = tiles[4 * t + 1];
        const long long len = tiles[4 * t + 2];
        const long long o = tiles[4 * t + 3];
        ARR_DECL
        for (long long j = threadIdx.x; j < len; j += blockDim.x) {
            BODY
        }
    }
}
'''
    src = (src.replace('NAME', name).replace('BUF_DECL', buf_decl).replace('ARR_DECL', arr_decl)
           .replace('BODY', body))
    return src, name
