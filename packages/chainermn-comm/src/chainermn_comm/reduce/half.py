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

Two ranks take one phase instead (:func:`one_phase`): each sends the other its whole array
(``Iallgather``) and both add the two copies in rank order, in float32, times ``post``
(:func:`sum_all`).  The bytes are the same as the two phases' (``n`` words each way), each
piece waits for one round trip instead of two, and the sum is not rounded back to 16 bits:
both ranks compute the same float32 bits, which they keep.  So with two ranks (or two nodes)
each term is rounded once and the sum not at all; with more, the sum is rounded once too.
On the namespace cluster at 10 Gbit/s, two ranks per node, this took a bfloat16 average of
the ResNet-50 set from 1.25x float32's time to 0.97x.  My block is sent from where it was
written (``start_allgather`` in place; ``InFlightSum.send_view``), so nothing is copied.
"""

import math

import numpy

from chainermn_comm.reduce import codecs as _codecs

__all__ = ['scale_into', 'Layout', 'start_exchange', 'add_own', 'start_gather', 'one_phase',
           'start_allgather', 'sum_all', 'sum_into', 'InFlightSum', 'TOP_EXP', 'MIN_EXP', 'MAX_EXP',
           'local_exponents', 'shared_factors', 'factors']

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


def one_phase(size):
    """Return whether a sum over ``size`` ranks takes one phase (``start_allgather``, ``sum_all``)."""
    return size == 2


def start_allgather(comm, flat, parts):
    """Start handing every rank all ranks' copies of the whole of ``flat`` (into ``parts``, in rank order).

    When ``flat`` is already my block of ``parts`` it is sent from there (no copy).
    """
    from mpi4py import MPI
    bits = MPI.UNSIGNED_SHORT
    n = flat.size
    mine = parts[comm.Get_rank() * n:(comm.Get_rank() + 1) * n]
    if n and mine.size == n and flat.__array_interface__['data'][0] == mine.__array_interface__['data'][0]:
        return comm.Iallgather(MPI.IN_PLACE, [parts.view(numpy.uint16), bits])
    return comm.Iallgather([flat.view(numpy.uint16), bits], [parts.view(numpy.uint16), bits])


def sum_all(out, parts, codec=None, post=1.0):
    """Write into float32 ``out`` the float32 sum, in rank order, of the ranks' copies in ``parts``, times ``post``."""
    n = out.size
    if not n:
        return
    codec = codec or _codecs.FLOAT16
    codec.sum_terms(out, [parts[j * n:(j + 1) * n] for j in range(parts.size // n)])
    if post != 1.0:
        numpy.multiply(out, post, out=out)


def sum_into(dst, terms, wide, codec=None, post=1.0, down=1.0):
    """Write ``terms``' float32 sum (in order) times ``post``, then times ``down``, into ``dst``.

    The same operations as :func:`sum_all` and a scaling by ``down`` afterwards, block by block
    through the float32 scratch ``wide``, so that each block's sum is still in cache when it
    is scaled and written.
    """
    codec = codec or _codecs.FLOAT16
    step = wide.size
    f32 = dst.dtype == numpy.float32
    for s in range(0, dst.size, step):
        e = min(dst.size, s + step)
        w = wide[:e - s]
        codec.sum_terms(w, [t[s:e] for t in terms])
        if down == 1.0 and f32:
            numpy.multiply(w, post, out=dst[s:e])
            continue
        if post != 1.0:
            numpy.multiply(w, post, out=w)
        scale_into(dst[s:e], w, down)


def start_gather(comm, flat, lay):
    """Start gathering every rank's summed segment back into ``flat`` on every rank."""
    from mpi4py import MPI
    bits = MPI.UNSIGNED_SHORT
    return comm.Iallgatherv(MPI.IN_PLACE, [flat.view(numpy.uint16), (lay.counts, lay.displs), bits])


class InFlightSum:
    """Sum one C-contiguous view over the ranks of ``comm`` in place, without blocking the caller.

    ``start`` begins it, ``step`` (call it when the first phase has had time) adds and
    starts the second phase of a sum on a 2-byte wire, ``wait`` ends it.  A view in a wire
    format (``codec``: float16 or bfloat16 words) goes through the phases of this module
    (one for two ranks); any other view is one ``Iallreduce``.  Buffers are kept for the next view.
    """

    def __init__(self, comm):
        self.comm = comm
        self.size = comm.Get_size()
        self.rank = comm.Get_rank()
        self._parts = numpy.empty(0, dtype=numpy.uint16)
        self._wide = numpy.empty(0, dtype=numpy.float32)
        self.req = None
        self._view = self._lay = self._codec = self._out = None
        self._post = 1.0
        #: Whether a 16-bit sum takes one phase and leaves float32 results (``start``'s ``out``).
        self.one_phase = one_phase(self.size)

    def start(self, view, codec=None, post=1.0, out=None):
        """Start summing ``view``; with ``codec``, the float32 sums are multiplied by ``post``.

        With ``codec`` and two ranks (:attr:`one_phase`) the float32 result goes into ``out``
        (a float32 view as long as ``view``); otherwise into ``view`` itself.
        """
        from mpi4py import MPI
        flat = view.reshape(-1)
        self._view = flat
        self._codec = self._out = None
        if codec is None:
            self._lay = None
            self.req = self.comm.Iallreduce(MPI.IN_PLACE, flat, MPI.SUM)
            return
        self._codec, self._post = codec, post
        if self.one_phase:
            if out is None or out.size != flat.size:
                raise ValueError('a sum of two ranks on a 16-bit wire needs out= of {} float32 elements'
                                 .format(flat.size))
            self._lay, self._out = None, out.reshape(-1)
            need = flat.size * self.size
        else:
            lay = self._lay = Layout(flat.size, self.size, self.rank)
            need = lay.mine * self.size
        self._reserve(need)
        parts = self._parts[:need].view(codec.storage)
        if self._lay is None:
            self.req = start_allgather(self.comm, flat, parts)
        else:
            self.req = start_exchange(self.comm, flat, lay, parts)

    def _reserve(self, need):
        if self._parts.size < need:
            self._parts = numpy.empty(need, dtype=numpy.uint16)
            self._wide = numpy.empty(need // self.size, dtype=numpy.float32)

    def send_view(self, n, codec):
        """Return my block of a one-phase sum of ``n`` words (``codec``'s): what is written there is sent in place."""
        self._reserve(n * self.size)
        return self._parts[self.rank * n:(self.rank + 1) * n].view(codec.storage)

    def step(self):
        """Add the first phase's terms and start the second phase (two-phase sums on a wire only)."""
        if self._lay is None:
            return
        self.req.Wait()
        add_own(self._view, self._lay, self._parts.view(self._codec.storage), self._wide, self.rank,
                self._codec, self._post)
        self.req = start_gather(self.comm, self._view, self._lay)
        self._lay = self._codec = None

    def poke(self):
        """Let MPI move the sum on (call between pieces of CPU work)."""
        if self.req is not None:
            self.req.Test()

    def wait(self):
        """End the sum (see :meth:`start` for where it is)."""
        self.step()
        self.req.Wait()
        if self._out is not None:  # one phase: every rank adds the copies itself
            n = self._view.size
            sum_all(self._out, self._parts[:n * self.size].view(self._codec.storage), self._codec,
                    self._post)
        self.req = self._view = self._codec = self._out = None
