"""Stream host arrays through a few reused buffers, so that packing and unpacking overlap the transfer.

A collective over many arrays is cut into *pieces* of at most ``chunk`` elements: a slice of
one large array (communicated in place) or a buffer packed with slices of small arrays.  Every
piece goes through the same fixed schedule: *prepare* (pack, cast, scale), one or two
nonblocking MPI collectives with CPU work between them, *finish* (unpack, scale).  While
piece ``t`` is on the wire the CPU prepares piece ``t + 1`` and finishes earlier pieces,
testing the outstanding requests between slices of that work so that MPI keeps moving bytes.

The schedule does not depend on timing: at tick ``t`` every rank starts phase 1 of piece
``t``, then phase 2 of piece ``t - 1``, and finishes piece ``t - LAG``, so every rank starts
the nonblocking collectives in the same order, as MPI requires.
"""

import collections
import functools
import time

import numpy

from chainermn_comm.reduce import codecs as _codecs
from chainermn_comm.reduce import half as _half

__all__ = ['Piece', 'cut', 'run', 'SumOp', 'HalfSumOp', 'BcastOp', 'POKE_ELEMS', 'POLITE_PAUSE',
           'MAX_PAUSE', 'POLL_BYTES', 'Pacer', 'polite_wait']

#: Elements of CPU work between two tests of the outstanding requests.
POKE_ELEMS = 1 << 17
#: Seconds a polite wait sleeps between two tests of a request (the shortest pause).
POLITE_PAUSE = 2e-5
#: The longest pause: MPI moves bytes only while it is tested, and 1 ms pauses halved the
#: rate of a 1 Gbit/s link.
MAX_PAUSE = 5e-4
#: Bytes a paced wait lets the fastest rate seen so far carry between two tests.
POLL_BYTES = 64 * 1024


def polite_wait(req, pause=POLITE_PAUSE):
    """Wait for ``req`` sleeping between tests, so the core is left to other threads (MPI would spin)."""
    while not req.Test():
        time.sleep(pause)


class Pacer:
    """Choose the pause of polite waits from the fastest transfer seen: about ``POLL_BYTES`` per test.

    Every test costs the waiting thread a wake-up and the computing thread a hand-over of the
    interpreter lock, so on a slow link fewer tests leave more of the core to the computation.
    The rate only ratchets up (a slow call, e.g. one that waited for another rank, never
    lengthens the pause), and the pause stays within ``POLITE_PAUSE`` and ``MAX_PAUSE``.
    """

    __slots__ = ('rate',)

    def __init__(self):
        self.rate = 0.0  # bytes per second, fastest seen; 0: nothing seen yet

    def pause(self):
        """Return the seconds to sleep between two tests."""
        if self.rate <= 0.0:
            return POLITE_PAUSE
        return min(MAX_PAUSE, max(POLITE_PAUSE, POLL_BYTES / self.rate))

    def observe(self, nbytes, seconds):
        """Record that ``nbytes`` went through in ``seconds``."""
        if seconds > 0.0 and nbytes > 0:
            self.rate = max(self.rate, nbytes / seconds)


def _wait(req):
    req.Wait()


class Piece:
    """One message: a slice of one array sent in place, or slices of several sent packed."""

    __slots__ = ('segs', 'direct', 'n')

    def __init__(self, segs, direct, n):
        self.segs = segs      # (flat array, start, length, offset in the piece)
        self.direct = direct  # the in-place view, or None when the piece is packed
        self.n = n


def cut(flat_arrays, chunk, in_place):
    """Cut ``flat_arrays`` into pieces of at most ``chunk`` elements.

    ``in_place(a)`` says whether array ``a`` is sent in place, slice by slice; the others are
    laid end to end into packed pieces.  In-place pieces come first, in array order, then the
    packed ones, so the cut depends only on the arrays' sizes and dtypes.
    """
    direct, packed = [], []
    for a in flat_arrays:
        if in_place(a):
            for s in range(0, a.size, chunk):
                view = a[s:s + chunk]
                direct.append(Piece([(a, s, view.size, 0)], view, view.size))
    segs, fill = [], 0
    for a in flat_arrays:
        if in_place(a):
            continue
        start = 0
        while start < a.size:
            take = min(chunk - fill, a.size - start)
            segs.append((a, start, take, fill))
            fill += take
            start += take
            if fill == chunk:
                packed.append(Piece(segs, None, fill))
                segs, fill = [], 0
    if fill:
        packed.append(Piece(segs, None, fill))
    return direct + packed


class _Poker:
    """Test the outstanding requests now and then, so that MPI progresses during CPU work."""

    __slots__ = ('reqs',)

    def __init__(self):
        self.reqs = []

    def __call__(self):
        if self.reqs:
            from mpi4py import MPI
            MPI.Request.Testall(self.reqs)

    def apply(self, fn, dst, src):
        """Call ``fn(dst, src)`` slice by slice, testing the requests in between."""
        n = dst.size
        if n <= POKE_ELEMS:
            fn(dst, src)
            self()
            return
        for s in range(0, n, POKE_ELEMS):
            fn(dst[s:s + POKE_ELEMS], src[s:s + POKE_ELEMS])
            self()


def run(pieces, op, nslots, polite=False):
    """Run ``op`` over ``pieces`` with up to ``nslots`` pieces alive at once (at least ``op.LAG + 1``).

    Pieces sent in place have nothing to pack, so they have no copy to hide: each goes first,
    in one blocking call (MPICH's blocking all-reduce of in-place slices is at least as fast
    as the same slices in flight two at a time).  With ``polite`` every piece is nonblocking
    and waits sleep between tests (:func:`polite_wait`): for a thread that averages while
    another computes, so that MPI's spinning does not take the core the computation needs.
    ``polite`` may be a :class:`Pacer`, which then sets the pause and learns this call's rate
    (one-phase ops only: between the two phases of float16 the owner's adds wait for the
    first, so long pauses there stall the wire; those waits keep the shortest pause).
    """
    if nslots < op.LAG + 1:
        raise ValueError('the schedule needs {} slots; got {}'.format(op.LAG + 1, nslots))
    if isinstance(polite, Pacer) and op.PHASES == 1:
        t0 = time.perf_counter()
        pause = polite.pause()
        _schedule(pieces, op, nslots, lambda req: polite_wait(req, pause), False)
        polite.observe(sum(p.n for p in pieces) * op.dtype.itemsize, time.perf_counter() - t0)
        return
    _schedule(pieces, op, nslots, polite_wait if polite else _wait, not polite)


def _schedule(pieces, op, nslots, wait, blocking_direct):
    """Run the fixed schedule of ``run``; ``blocking_direct``: in-place pieces go first, blocking."""
    if blocking_direct:
        packed = []
        for p in pieces:
            if p.direct is None:
                packed.append(p)
            else:
                op.blocking(p)
        pieces = packed
    poke = _Poker()
    live = collections.deque()  # [piece, slot, data, request], oldest first
    total = len(pieces)
    for t in range(total + op.LAG):
        if t < total:
            p = pieces[t]
            slot = t % nslots
            data = p.direct if p.direct is not None else op.piece_buffer(slot, p.n)
            op.prepare(p, data, poke)
            entry = [p, slot, data, op.start(1, p, slot, data)]
            live.append(entry)
            poke.reqs.append(entry[3])
        if op.PHASES == 2 and 1 <= t <= total:
            entry = live[-2] if t < total else live[-1]
            wait(entry[3])
            op.middle(entry[0], entry[1], entry[2], poke)
            entry[3] = op.start(2, entry[0], entry[1], entry[2])
            poke.reqs = [e[3] for e in live]
        if t >= op.LAG:
            p, slot, data, req = live.popleft()
            wait(req)
            poke.reqs = [e[3] for e in live]
            op.finish(p, slot, data, poke)


class _Op:
    """What a collective does with each piece; subclasses fill in the phases."""

    PHASES = 1
    LAG = 2

    def __init__(self, comm, dtype, chunk, nslots):
        self.comm = comm
        self.dtype = dtype
        self.chunk = chunk
        self._bufs = [None] * nslots

    def piece_buffer(self, slot, n):
        """Return where a packed piece of ``n`` elements is prepared in ``slot``."""
        return self.buffer(slot)[:n]

    def buffer(self, slot):
        buf = self._bufs[slot]
        if buf is None:
            buf = self._bufs[slot] = numpy.empty(self.chunk, dtype=self.dtype)
        return buf

    def prepare(self, piece, data, poke):
        pass

    def blocking(self, piece):
        raise NotImplementedError('{} sends no piece in place'.format(type(self).__name__))

    def middle(self, piece, slot, data, poke):
        pass

    def finish(self, piece, slot, data, poke):
        pass


def _copy(dst, src):
    numpy.copyto(dst, src, casting='unsafe')


class SumOp(_Op):
    """Average over ranks: pack, ``Iallreduce`` in place, unpack scaled by ``scale``."""

    def __init__(self, comm, dtype, chunk, nslots, scale):
        super().__init__(comm, dtype, chunk, nslots)
        self.scale = scale

        def scaled(dst, src, s=scale):
            numpy.multiply(src, s, out=dst, casting='unsafe')
        self._scaled = scaled

    def prepare(self, piece, data, poke):
        if piece.direct is None:
            for a, s, n, off in piece.segs:
                poke.apply(_copy, data[off:off + n], a[s:s + n])

    def start(self, phase, piece, slot, data):
        from mpi4py import MPI
        return self.comm.Iallreduce(MPI.IN_PLACE, data, MPI.SUM)

    def blocking(self, piece):
        from mpi4py import MPI
        view = piece.direct
        self.comm.Allreduce(MPI.IN_PLACE, view, MPI.SUM)
        numpy.multiply(view, self.scale, out=view)  # while the slice is still in cache

    def finish(self, piece, slot, data, poke):
        for a, s, n, off in piece.segs:
            poke.apply(self._scaled, a[s:s + n], data[off:off + n])


class HalfSumOp(_Op):
    """Average with 16-bit words on the wire (float16 or bfloat16), summed in float32 (``reduce.half``).

    Two phases per piece: phase 1 hands every rank all ranks' copies of its segment of the
    piece (``Ialltoallv``); between the phases the owner adds them in float32 in rank order,
    multiplies by ``post`` and rounds once; phase 2 gathers the segments back
    (``Iallgatherv``).  Values are multiplied by their array's ``up`` factor as they are
    packed (float16: ``1/size`` times a power of two, :meth:`use_factors`) and by its
    ``down`` factor as they are unpacked.  Two ranks take one phase (``reduce.half.one_phase``):
    an ``Iallgather`` of the whole piece, then each rank adds both copies in float32, times
    ``post``, and unpacks those sums (times ``down``) without rounding them again.
    """

    PHASES = 2
    LAG = 3

    def __init__(self, comm, chunk, nslots, codec=None):
        codec = codec or _codecs.FLOAT16
        super().__init__(comm, codec.storage, chunk, nslots)
        self.codec = codec
        self.size = comm.Get_size()
        self.rank = comm.Get_rank()
        share = chunk // self.size + 1
        self._parts = [None] * nslots
        self._share = share
        self._wide = numpy.empty(share, dtype=numpy.float32)
        self._layouts = {}
        self._up = self._down = {}
        self._post = 1.0
        if _half.one_phase(self.size):
            self.PHASES = 1
            self._share = chunk
            self._wide = numpy.empty(min(chunk, _codecs.BLOCK), dtype=numpy.float32)

    def use_factors(self, arrays, ups, downs, post=1.0):
        """Set, for the next ``run``, the factor of every array (those given to ``cut``) before and
        after the wire, and the factor of the owners' float32 sums."""
        self._up = {id(a): u for a, u in zip(arrays, ups)}
        self._down = {id(a): d for a, d in zip(arrays, downs)}
        self._post = post

    def _layout(self, n):
        lay = self._layouts.get(n)
        if lay is None:
            lay = self._layouts[n] = _half.Layout(n, self.size, self.rank)
        return lay

    def _parts_of(self, slot):
        parts = self._parts[slot]
        if parts is None:
            parts = self._parts[slot] = numpy.empty(self.size * self._share, dtype=self.dtype)
        return parts

    def prepare(self, piece, data, poke):
        encode = self.codec.encode
        for a, s, n, off in piece.segs:
            poke.apply(functools.partial(encode, scale=self._up[id(a)]), data[off:off + n], a[s:s + n])

    def piece_buffer(self, slot, n):
        if self.PHASES == 1:  # my block of the gathered copies: the all-gather sends it in place
            return self._parts_of(slot)[self.rank * n:(self.rank + 1) * n]
        return self.buffer(slot)[:n]

    def start(self, phase, piece, slot, data):
        if self.PHASES == 1:
            return _half.start_allgather(self.comm, data, self._parts_of(slot)[:data.size * self.size])
        lay = self._layout(data.size)
        if phase == 1:
            parts = self._parts_of(slot)[:lay.mine * self.size]
            return _half.start_exchange(self.comm, data, lay, parts)
        return _half.start_gather(self.comm, data, lay)

    def middle(self, piece, slot, data, poke):
        _half.add_own(data, self._layout(data.size), self._parts_of(slot), self._wide, self.rank,
                      self.codec, self._post)
        poke()

    def finish(self, piece, slot, data, poke):
        if self.PHASES == 1:  # every rank adds both copies; the float32 sums are the result
            m = data.size
            parts = self._parts_of(slot)
            terms = [parts[j * m:(j + 1) * m] for j in range(self.size)]
            for a, s, n, off in piece.segs:
                down = self._down[id(a)]
                for b in range(0, n, POKE_ELEMS):
                    e = min(n, b + POKE_ELEMS)
                    _half.sum_into(a[s + b:s + e], [t[off + b:off + e] for t in terms], self._wide,
                                   self.codec, self._post, down)
                    poke()
            return
        decode = self.codec.decode
        for a, s, n, off in piece.segs:
            poke.apply(functools.partial(decode, scale=self._down[id(a)]), a[s:s + n], data[off:off + n])


class BcastOp(_Op):
    """Broadcast from ``root``: the root packs, everyone ``Ibcast``s, the others unpack."""

    def __init__(self, comm, dtype, chunk, nslots, root):
        super().__init__(comm, dtype, chunk, nslots)
        self.root = root
        self.is_root = comm.Get_rank() == root

    def prepare(self, piece, data, poke):
        if self.is_root and piece.direct is None:
            for a, s, n, off in piece.segs:
                poke.apply(_copy, data[off:off + n], a[s:s + n])

    def start(self, phase, piece, slot, data):
        return self.comm.Ibcast(data, root=self.root)

    def blocking(self, piece):
        self.comm.Bcast(piece.direct, root=self.root)

    def finish(self, piece, slot, data, poke):
        if not self.is_root and piece.direct is None:
            for a, s, n, off in piece.segs:
                poke.apply(_copy, a[s:s + n], data[off:off + n])
