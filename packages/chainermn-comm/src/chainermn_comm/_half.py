"""Sum arrays over ranks with 16-bit words on the wire (float16 or bfloat16) and float32 additions.

MPI has no float16 sum that every library offers, and where one exists it adds pairwise in
float16, so the result depends on the order the library picks (ranks' values 2/3, 4/3 and 2
can come out 3.998 instead of 4.0).  Here every rank owns one segment of the array: a
personalised all-to-all hands each owner every rank's copy of its segment, the owner adds
them in float32 in rank order and rounds once to float16, and an all-gather returns the
segments.  Each rank sends and receives ``2 (N-1)/N`` of the array, the same bytes as a
bandwidth-optimal all-reduce, and every rank ends with the same bits.

Before the cast every array is multiplied by a power of two that the ranks agree on
(:func:`shared_factors`): the largest ``|value|`` of the array over all ranks lands just
below ``2**TOP_EXP``.  Small gradients then stay normal float16 numbers instead of
subnormals (which keep fewer digits, and which NumPy converts about 40 times slower), and
large ones cannot overflow.  The exponent depends only on the array's values, not on how
arrays are cut into messages, and multiplying by a power of two is exact, so chunks, buckets
and ``overlap=True`` give the same bits.

bfloat16 (``_codecs.BFLOAT16``) takes the same two phases without the power of two: its range
is float32's.  Its owner multiplies the float32 sum by ``1/size`` before it rounds it.
"""

import math

import numpy

from chainermn_comm import _codecs

__all__ = ['scale_into', 'Layout', 'start_exchange', 'add_own', 'start_gather',
           'InFlightSum', 'TOP_EXP', 'MIN_EXP', 'MAX_EXP', 'local_exponents',
           'shared_factors', 'factors']

#: A prescaled array's largest ``|value|`` is below ``2**TOP_EXP``, so the sum over all
#: ranks (each term divided by the rank count) stays far below float16's largest, 65504.
TOP_EXP = 14
#: The exponents' range: ``2**e / size`` and ``2**-e`` stay normal float32 numbers.
MIN_EXP, MAX_EXP = -100, 100


def scale_into(dst, src, scale):
    """Write ``src * scale`` into ``dst``, multiplying in float32 (float64 if either is) and rounding once."""
    wide = numpy.float64 if numpy.float64 in (src.dtype, dst.dtype) else numpy.float32
    numpy.multiply(src, scale, out=dst, dtype=wide, casting='unsafe')


def local_exponents(arrays):
    """Return, per array, the largest ``e`` with ``max|a| * 2**e < 2**TOP_EXP`` (int32).

    An array of zeros puts no limit (``MAX_EXP``); one holding NaN or infinity gets 0 (no
    scaling, so the non-finite values stay what they are).
    """
    out = numpy.full(len(arrays), MAX_EXP, dtype=numpy.int32)
    for i, a in enumerate(arrays):
        if not a.size:
            continue
        hi, lo = float(a.max()), float(a.min())
        if not (math.isfinite(hi) and math.isfinite(lo)):
            out[i] = 0
            continue
        m = max(hi, -lo)
        if m > 0.0:
            out[i] = min(MAX_EXP, max(MIN_EXP, TOP_EXP - math.frexp(m)[1]))
    return out


def shared_factors(comm, arrays, scale, wait=None):
    """Return ``(up, down)`` per array: ``scale`` times the power of two the ranks of ``comm`` agree on, and its inverse.

    The exponent is the smallest of the ranks' :func:`local_exponents`.  ``wait(request)``,
    when given, waits for the nonblocking all-reduce (e.g. politely).
    """
    exps = local_exponents(arrays)
    if comm.Get_size() > 1:
        from mpi4py import MPI
        if wait is None:
            comm.Allreduce(MPI.IN_PLACE, exps, MPI.MIN)
        else:
            wait(comm.Iallreduce(MPI.IN_PLACE, exps, MPI.MIN))
    return factors(exps, scale)


def factors(exps, scale):
    """Return ``(up, down)``: per exponent, the factor applied before the cast and the one after."""
    return ([math.ldexp(scale, int(e)) for e in exps], [math.ldexp(1.0, -int(e)) for e in exps])


def _bounds(n, size):
    return [n * j // size for j in range(size + 1)]


class Layout:
    """How a float16 array of ``n`` elements is cut into one segment per rank."""

    __slots__ = ('bounds', 'counts', 'displs', 'mine', 'rcounts', 'rdispls')

    def __init__(self, n, size, rank):
        self.bounds = _bounds(n, size)
        self.counts = [self.bounds[j + 1] - self.bounds[j] for j in range(size)]
        self.displs = self.bounds[:-1]
        self.mine = self.counts[rank]
        self.rcounts = [self.mine] * size
        self.rdispls = [self.mine * j for j in range(size)]


def start_exchange(comm, flat, lay, parts):
    """Start handing every rank all ranks' copies of its segment of ``flat`` (into ``parts``)."""
    from mpi4py import MPI
    bits = MPI.UNSIGNED_SHORT  # move raw 16-bit words: no MPI needs to know float16
    return comm.Ialltoallv([flat.view(numpy.uint16), (lay.counts, lay.displs), bits],
                           [parts.view(numpy.uint16), (lay.rcounts, lay.rdispls), bits])


def add_own(flat, lay, parts, wide, rank, codec=None, post=1.0):
    """Add the ranks' copies of my segment in float32, in rank order, and round once into ``flat``.

    ``codec`` is the wire format (``_codecs.FLOAT16`` when None); the sum is multiplied by
    ``post`` before it is rounded (bfloat16's ``1/size``; float16 terms come scaled).
    """
    mine = lay.mine
    if not mine:
        return
    codec = codec or _codecs.FLOAT16
    size = len(lay.counts)
    terms = [parts[j * mine:(j + 1) * mine] for j in range(size)]
    wide = wide[:mine]
    codec.sum_terms(wide, terms)
    codec.encode(flat[lay.bounds[rank]:lay.bounds[rank + 1]], wide, post)


def start_gather(comm, flat, lay):
    """Start gathering every rank's summed segment back into ``flat`` on every rank."""
    from mpi4py import MPI
    bits = MPI.UNSIGNED_SHORT
    return comm.Iallgatherv(MPI.IN_PLACE, [flat.view(numpy.uint16), (lay.counts, lay.displs), bits])


class InFlightSum:
    """Sum one C-contiguous view over the ranks of ``comm`` in place, without blocking the caller.

    ``start`` begins it, ``step`` (call it when the first phase has had time) adds and
    starts the second phase of a sum on a 2-byte wire, ``wait`` ends it.  A view in a wire
    format (``codec``: float16 or bfloat16 words) goes through the two phases of this
    module; any other view is one ``Iallreduce``.  Buffers are kept for the next view.
    """

    def __init__(self, comm):
        self.comm = comm
        self.size = comm.Get_size()
        self.rank = comm.Get_rank()
        self._parts = numpy.empty(0, dtype=numpy.uint16)
        self._wide = numpy.empty(0, dtype=numpy.float32)
        self.req = None
        self._view = self._lay = self._codec = None
        self._post = 1.0

    def start(self, view, codec=None, post=1.0):
        """Start summing ``view``; with ``codec``, the owner's float32 sum is multiplied by ``post``."""
        from mpi4py import MPI
        flat = view.reshape(-1)
        self._view = flat
        if codec is None:
            self._lay = None
            self.req = self.comm.Iallreduce(MPI.IN_PLACE, flat, MPI.SUM)
            return
        lay = self._lay = Layout(flat.size, self.size, self.rank)
        self._codec, self._post = codec, post
        need = lay.mine * self.size
        if self._parts.size < need:
            self._parts = numpy.empty(need, dtype=numpy.uint16)
            self._wide = numpy.empty(lay.mine, dtype=numpy.float32)
        self.req = start_exchange(self.comm, flat, lay, self._parts[:need].view(codec.storage))

    def step(self):
        if self._lay is None:
            return
        self.req.Wait()
        add_own(self._view, self._lay, self._parts.view(self._codec.storage), self._wide, self.rank,
                self._codec, self._post)
        self.req = start_gather(self.comm, self._view, self._lay)
        self._lay = None

    def poke(self):
        """Let MPI move the sum on (call between pieces of CPU work)."""
        if self.req is not None:
            self.req.Test()

    def wait(self):
        self.step()
        self.req.Wait()
        self.req = self._view = None
