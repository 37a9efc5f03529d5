"""Reduce-scatter and all-gather of owned arrays through node-shared memory.

The shares of :mod:`chainermn_comm.reduce.shard` (each rank's owned arrays laid end to end) move
through the staging window of :mod:`chainermn_comm.reduce.node_shared` instead of MPI messages,
in rounds, each round in one half of every rank's segment (the other half is the previous round's,
which peers may still read), one barrier per round:

- :meth:`NodeShares.mean_to_owners`: each rank copies the round's slice of every other rank's
  share into slot ``owner`` of its segment (``size`` slots per half); after the barrier each owner
  adds the terms of its own slice, its own read from its arrays and the peers' read straight from
  their segments, in rank order, and writes the mean into its arrays.  The sums are those of the
  MPI path (``reduce.shard``, exact wire): the same bits.
- :meth:`NodeShares.gather_from_owners`: each owner copies the round's slice of its share into its
  segment (one slot per half: rounds ``size`` times longer); after the barrier every rank copies
  the other owners' slices into its arrays, byte for byte.

With several nodes (:meth:`NodeShares.mean_via_nodes`, :meth:`NodeShares.gather_via_nodes`) each
node sums every array to its rank whose local rank is the owner's, those ranks average the node
sums across nodes over MPI (``reduce.shard``), and the way back is the reverse.

Shared memory is no wire: a 16-bit ``wire`` does not apply here (the terms are staged in the
arrays' own dtype, float16 ones added in float32, as the node-shared all-reduce does).  Every byte
is written once into shared memory and read from it once by the rank that needs it: no MPI buffer,
no pack/unpack, and the staging of round ``k + 1`` runs while peers still read round ``k``.
"""

import numpy

__all__ = ['NodeShares', 'MIN_SLOT_BYTES', 'sum_terms', 'two_in_flight']

#: Below this many bytes per rank and round the window is too small: the MPI path runs instead.
MIN_SLOT_BYTES = 64
_ALIGN = 16  # a piece never splits an element (complex128 included)


def _u8(flat):
    return flat.view(numpy.uint8) if flat.size else numpy.empty(0, numpy.uint8)


class NodeShares:
    """Move the shares of ``mpi_comm``'s ranks through ``state`` (``node_shared``'s window).

    ``state`` is the node-shared state of a communicator whose ranks all sit on one node (its
    local ranks are the communicator's ranks).  ``plan_of(kind, nbytes, owners, chunk)`` returns
    ``reduce.shard.share_plan``'s answer (cached by the caller).
    """

    def __init__(self, state, plan_of):
        self.state = state
        self.rank = state.local_rank
        self.size = state.local_size
        self._plan_of = plan_of
        seg = state.segments[0].size
        self.half = seg // 2 // _ALIGN * _ALIGN
        #: Bytes per rank and round of the reduce-scatter (one slot per owner in each half).
        self.slot = self.half // self.size // _ALIGN * _ALIGN
        self._scratch = None
        #: With several nodes: ``(local rank, cross-node rank)`` of every rank of the job (None: one node).
        self.places = None
        self._mean_across = self._gather_across = None

    def join_nodes(self, places, mean_across, gather_across):
        """Span several nodes: ``places`` (see the attribute), and the MPI reduce-scatter
        ``mean_across(flats, owners, codec, inv)`` and all-gather ``gather_across(flats, owners)``
        over ``state.inter`` (this local rank's ranks on every node; owners: their ranks there)."""
        self.places = places
        self._mean_across, self._gather_across = mean_across, gather_across

    def mean_via_nodes(self, flats, owners, codec, inv):
        """Several nodes: sum to the owner's local rank on every node, then average across nodes.

        Each node's sum of an array goes, through node-shared memory, to the rank of that node
        whose local rank is the owner's (exact: no wire inside a node); those ranks, one per node,
        average the node sums to the owner over MPI (``codec`` applies there; ``inv``: 1 / ranks of
        the job).  Each node's link carries each node's sum once, as the all-reduce does.  That
        rank's copy then holds its node's sum (not its own term).
        """
        places = self.places
        local = tuple(places[o][0] for o in owners)
        self.mean_to_owners(flats, local, inv=1.0)
        mine = [i for i, r in enumerate(local) if r == self.rank]  # the same on every node
        if mine:
            self._mean_across([flats[i] for i in mine], tuple(places[owners[i]][1] for i in mine), codec, inv)

    def gather_via_nodes(self, flats, owners):
        """Several nodes: the owners' bytes to their local rank on every node, then to that node's ranks."""
        places = self.places
        local = tuple(places[o][0] for o in owners)
        mine = [i for i, r in enumerate(local) if r == self.rank]
        if mine:
            self._gather_across([flats[i] for i in mine], tuple(places[owners[i]][1] for i in mine))
        self.gather_from_owners(flats, local)

    @property
    def usable(self):
        """Whether the window is large enough to carry the shares."""
        return self.slot >= MIN_SLOT_BYTES

    def mean_to_owners(self, flats, owners, inv=None):
        """Average the flat C-contiguous host ``flats`` over the node's ranks into their owners' copies.

        ``owners`` are local ranks; ``inv`` scales the sums (default ``1 / size``; 1.0: the sums).
        """
        size, me, slot = self.size, self.rank, self.slot
        nbytes = [f.nbytes for f in flats]
        rounds, _ = self._plan_of(('node-mean', tuple(f.dtype.str for f in flats)), nbytes, owners, slot)
        segs = self.state.segments
        mine = segs[me]
        sync = self.state.sync
        inv = 1.0 / size if inv is None else inv
        half = self.half
        u8 = [_u8(f) for f in flats]

        def stage(k):
            base = (k & 1) * half
            for r in range(size):
                if r == me:
                    continue
                at = base + r * slot
                for i, start, stop, off in rounds[k][r]:
                    mine[at + off:at + off + stop - start] = u8[i][start:stop]

        def add(k):
            at = (k & 1) * half + me * slot
            for i, start, stop, off in rounds[k][me]:
                f = flats[i]
                w = f.dtype.itemsize
                out = f[start // w:stop // w]
                lo, hi = at + off, at + off + stop - start
                terms = [out if p == me else segs[p][lo:hi].view(f.dtype) for p in range(size)]
                if me >= 2:  # the first two terms are added into ``out``: keep my term apart
                    terms[me] = self._copy_of(out)
                sum_terms(out, terms, inv)

        n = len(rounds)
        stage(0)
        sync()
        for k in range(n):
            if k + 1 < n:
                stage(k + 1)  # the other half: peers read only this round's half now
            add(k)
            sync()

    def gather_from_owners(self, flats, owners):
        """Copy every owner's flat C-contiguous host ``flats`` to every rank, byte for byte."""
        size, me, half = self.size, self.rank, self.half
        u8 = [_u8(f) for f in flats]
        rounds, _ = self._plan_of('node-gather', [b.size for b in u8], owners, half)
        segs = self.state.segments
        mine = segs[me]
        sync = self.state.sync

        def put(k):
            at = (k & 1) * half
            for i, start, stop, off in rounds[k][me]:
                mine[at + off:at + off + stop - start] = u8[i][start:stop]

        def take(k):
            at = (k & 1) * half
            for r in range(size):
                if r == me:
                    continue
                seg = segs[r]
                for i, start, stop, off in rounds[k][r]:
                    u8[i][start:stop] = seg[at + off:at + off + stop - start]

        n = len(rounds)
        put(0)
        sync()
        for k in range(n):
            if k + 1 < n:
                put(k + 1)
            take(k)
            sync()

    def _copy_of(self, a):
        need = a.nbytes
        if self._scratch is None or self._scratch.size < need:
            self._scratch = numpy.empty(max(need, self.slot), numpy.uint8)
        out = self._scratch[:need].view(a.dtype)
        out[...] = a
        return out


def two_in_flight(n, begin, finish):
    """Run rounds ``0..n-1``: begin round ``k + 1`` (pack, nonblocking call) before finishing round ``k``.

    The link carries one round while this rank packs the next and unpacks or sums the last (two
    buffers each way); rounds finish in order on every rank, and each element is summed once, so
    the bits are those of one round at a time.
    """
    pending = begin(0)
    for k in range(n):
        nxt = begin(k + 1) if k + 1 < n else None
        finish(k, pending)
        pending = nxt


def sum_terms(out, terms, inv):
    """Write the sum of ``terms`` (added in rank order) times ``inv`` into ``out`` (float16: added in
    float32; integers: divided by the number of terms)."""
    if out.dtype == numpy.float16:
        wide = terms[0].astype(numpy.float32)
        for t in terms[1:]:
            numpy.add(wide, t, out=wide)
        numpy.multiply(wide, numpy.float32(inv), out=out, casting='unsafe')
        return
    numpy.add(terms[0], terms[1], out=out)
    for t in terms[2:]:
        numpy.add(out, t, out=out)
    if out.dtype.kind == 'f':
        numpy.multiply(out, out.dtype.type(inv), out=out)
    elif out.dtype.kind == 'c':
        numpy.multiply(out, inv, out=out)
    else:
        numpy.floor_divide(out, len(terms), out=out)
