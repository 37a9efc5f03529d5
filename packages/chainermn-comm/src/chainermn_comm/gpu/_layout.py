"""Pure (NumPy-only) planning for GPU gradient packing: offsets, tiles, padding, kernel source."""

import numpy

__all__ = ['GradLayout', 'plan_layout', 'padded_size', 'rank_position', 'ctype_of',
           'pack_kernel_source', 'TILE_ELEMS', 'SUPPORTED_FLOATS']

#: Elements handled by one thread block of the batched pack/unpack kernel.
TILE_ELEMS = 8192

#: Floating dtypes gradients may be packed from or into.
SUPPORTED_FLOATS = (numpy.dtype(numpy.float16), numpy.dtype(numpy.float32), numpy.dtype(numpy.float64))

_STORAGE = {'float16': 'unsigned short', 'float32': 'float', 'float64': 'double'}


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
    """Return the C storage type the batched kernel uses for ``dtype`` (float16 as raw bits)."""
    dt = numpy.dtype(dtype)
    try:
        return _STORAGE[dt.name]
    except KeyError:
        raise ValueError('GPU gradient packing supports float16, float32 and float64; got {}'.format(dt))


def _load(dt, expr, work):
    if dt.name == 'float16':
        return '({})chainermn_h2f({})'.format(work, expr)
    return '({})({})'.format(work, expr)


def _store(dt, expr):
    if dt.name == 'float16':
        return 'chainermn_f2h((float)({}))'.format(expr)
    return '({})({})'.format(_STORAGE[dt.name], expr)


def pack_kernel_source(src_dtype, dst_dtype, direction):
    """Return (CUDA source, kernel name) of the batched kernel between arrays and a packed buffer.

    ``direction`` is ``'pack'`` (arrays of ``src_dtype`` into a buffer of ``dst_dtype``) or
    ``'unpack'`` (buffer of ``dst_dtype`` into arrays of ``src_dtype``).  The kernel takes
    ``(ptrs, tiles, n_tiles, scale, buf)``; block ``b`` handles tiles ``b, b + gridDim.x, ...``.
    Half precision goes through PTX ``cvt`` so no CUDA header is needed.
    """
    s = numpy.dtype(src_dtype)
    d = numpy.dtype(dst_dtype)
    ctype_of(s), ctype_of(d)
    if direction not in ('pack', 'unpack'):
        raise ValueError("direction must be 'pack' or 'unpack'; got {!r}".format(direction))
    work = 'double' if 'float64' in (s.name, d.name) else 'float'
    name = 'chainermn_{}_{}_{}'.format(direction, s.name, d.name)
    if direction == 'pack':
        body = 'buf[o + j] = {};'.format(_store(d, '{} * ({})scale'.format(
            _load(s, 'arr[st + j]', work), work)))
        arr_decl = 'const {} *arr = (const {} *)ptrs[a];'.format(ctype_of(s), ctype_of(s))
        buf_decl = '{} *buf'.format(ctype_of(d))
    else:
        body = 'arr[st + j] = {};'.format(_store(s, '{} * ({})scale'.format(
            _load(d, 'buf[o + j]', work), work)))
        arr_decl = '{} *arr = ({} *)ptrs[a];'.format(ctype_of(s), ctype_of(s))
        buf_decl = 'const {} *buf'.format(ctype_of(d))
    src = r'''
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
