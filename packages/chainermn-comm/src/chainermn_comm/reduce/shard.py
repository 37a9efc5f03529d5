"""Reduce-scatter and all-gather of whole arrays to and from their owners (sharded optimizer state).

Every array has one owner rank.  :meth:`ShardCollectives.mean_to_owners` leaves in each owner's
arrays the average over all ranks (the other ranks' copies are left as they were, except, across
nodes through node-shared memory, those of the owner's local rank on the other nodes: they hold
their node's sum), and
:meth:`ShardCollectives.gather_from_owners` copies every owner's arrays to every rank, byte for
byte.  Together they move the bytes of one all-reduce.

Each rank's share is its arrays one after another (each padded to 16 bytes), and the shares move
in rounds of at most ``chunk`` bytes per rank through buffers that are reused (one huge MPI call is
slow on MPICH: ARCHITECTURE.md, "Big messages"):

- host, every rank on one node and the node-shared path of the average usable (the same
  conditions: ``CHAINERMN_SHM_REDUCE``, ranks really sharing memory): through the average's
  node-shared window (``reduce.shard_node``), the same sums in the same order, no MPI message;
- host, several nodes of the same number of ranks and the node-shared path usable: each node's
  sum of an array goes through node-shared memory to the node's rank whose local rank is the
  owner's, and those ranks (one per node) average the node sums to the owner as below (the wire
  applies there; float16 and integer sets take the path below); the way back in reverse.  Each
  node's link carries each node's sum once, as the all-reduce does;
- host, otherwise: an ``Ialltoallv`` of the terms of each rank's slice, summed by the owner in
  rank order (deterministic), in the array's dtype or, on a 16-bit wire, in float32
  (``reduce.codecs``; float16 terms are prescaled by ``1/size`` and a power of two the ranks agree
  on, as the all-reduce does); the way back is an ``Iallgatherv`` of the owners' bytes.  Two
  rounds are in flight (two buffers each way): the link carries one while the rank packs the
  next and sums or unpacks the last.
- device, on a communicator with an NCCL group over all ranks: ``reduceScatter`` per dtype and
  ``allGather`` of bytes, each rank's slice padded to the round's size (NCCL counts are equal).
  A 16-bit wire on the device goes through the host path.

``wire``: None (the arrays' own dtype), ``numpy.float16``, ``'bfloat16'`` or ``'auto'`` (the
first calls time each wire, then the ranks agree on the fastest: a 16-bit one only when it is at
least 10% faster than the exact one).
"""

import time

import numpy

from chainermn_comm import _arrays
from chainermn_comm.guard import stable_code
from chainermn_comm.reduce import codecs as _codecs
from chainermn_comm.reduce import half as _half
from chainermn_comm.reduce.shard_node import NodeShares
from chainermn_comm.reduce.shard_node import sum_terms as _sum_terms
from chainermn_comm.reduce.shard_node import two_in_flight as _two_in_flight

__all__ = ['ShardCollectives', 'share_plan', 'DEFAULT_CHUNK_BYTES']

#: Bytes per rank and round (the buffers hold ``size`` times this), at most.
DEFAULT_CHUNK_BYTES = 1 << 20
#: The host buffers' size that the default round keeps to with many ranks (``size * chunk``; two
#: such buffers each way).
_BUFFER_BYTES = 16 << 20
_MIN_CHUNK = 64 << 10
_ALIGN = 16  # a piece never splits an element (complex128 included)
_AUTO_ROUNDS = 2          # timed calls per candidate wire under 'auto'
_AUTO_CANDIDATES = (None, 'bfloat16', 'float16')


def _pad(n):
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


def share_plan(nbytes, owners, size, chunk):
    """Return ``(rounds, counts)``: per round and rank, the pieces ``(index, start, stop, offset)``
    (bytes of array ``index``, at ``offset`` in the rank's slice of the round), and the bytes of
    each rank's slice per round."""
    shares = [[] for _ in range(size)]
    for i, (n, r) in enumerate(zip(nbytes, owners)):
        shares[r].append(i)
    totals = [sum(_pad(nbytes[i]) for i in share) for share in shares]
    nrounds = max(1, -(-max(totals) // chunk)) if totals else 1
    rounds = [[[] for _ in range(size)] for _ in range(nrounds)]
    counts = [[0] * size for _ in range(nrounds)]
    for r, share in enumerate(shares):
        pos = 0
        for i in share:
            n = nbytes[i]
            start = 0
            while start < n:
                k, off = divmod(pos + start, chunk)
                stop = min(n, start + chunk - off)
                rounds[k][r].append((i, start, stop, off))
                start = stop
            pos += _pad(n)
        for k in range(nrounds):
            counts[k][r] = max(0, min(chunk, totals[r] - k * chunk))
    return rounds, counts


def _wire_label(wire):
    if wire is None:
        return 'exact'
    if isinstance(wire, str):
        return wire
    return numpy.dtype(wire).name


class ShardCollectives:
    """The reduce-scatter and all-gather of owned arrays over one communicator.

    Made by the communicator (``comm.averaging.shard_collectives()``): ``mpi_comm`` is its MPI
    communicator, ``guard_of()`` returns its call guard, ``nccl`` its NCCL group over all ranks
    (or None), ``reducer_of()`` its host reducer (``reduce.node_shared.NodeReducer``, or None:
    MPI messages only), whose node-shared window carries the shares when all ranks share a node.
    """

    def __init__(self, mpi_comm, guard_of, nccl=None, chunk=None, reducer_of=None):
        self.mpi_comm = mpi_comm
        self._reducer_of = reducer_of
        self._node = None  # NodeShares over the reducer's window, while that window lives
        self.rank = mpi_comm.Get_rank()
        self.size = mpi_comm.Get_size()
        self._guard_of = guard_of
        self.nccl = nccl
        if chunk is None:
            chunk = min(DEFAULT_CHUNK_BYTES, max(_MIN_CHUNK, _BUFFER_BYTES // self.size))
        self.chunk = _pad(int(chunk))
        self._plans = {}
        self._bufs = {}
        self._autos = {}  # (arrays, bytes) -> {'times', 'calls', 'choice'}: 'auto' decides per set

    # -- public --------------------------------------------------------------------
    def mean_to_owners(self, arrays, owners, wire=None):
        """Average ``arrays`` over all ranks into their owners' copies (``owners[i]``: a rank)."""
        owners = self._check(arrays, owners, 'mean_to_owners')
        if self.size == 1:
            return
        if wire is not None and isinstance(wire, str) and wire.strip().lower() == 'auto':
            label = 'auto'
        else:
            label = _wire_label(wire)
        shapes = tuple(tuple(a.shape) for a in arrays)
        codes = tuple(stable_code(a.dtype.str) for a in arrays)

        def sig():
            return (('arrays', tuple((tuple(a.shape), a.dtype.str) for a in arrays)),
                    ('owners', owners), ('wire', label))

        key = (shapes, codes, owners, stable_code(label))
        with self._guard_of()('mean_to_owners', sig, key=key):
            if label == 'auto':
                self._mean_auto(arrays, owners)
            else:
                self._mean(arrays, owners, wire)

    def gather_from_owners(self, arrays, owners):
        """Copy every owner's ``arrays`` to every rank (byte for byte)."""
        owners = self._check(arrays, owners, 'gather_from_owners')
        if self.size == 1:
            return
        shapes = tuple(tuple(a.shape) for a in arrays)
        codes = tuple(stable_code(a.dtype.str) for a in arrays)

        def sig():
            return (('arrays', tuple((tuple(a.shape), a.dtype.str) for a in arrays)), ('owners', owners))

        with self._guard_of()('gather_from_owners', sig, key=(shapes, codes, owners)):
            if self._on_nccl(arrays):
                self._gather_nccl(arrays, owners)
                return
            node = self._node_shares()
            if node is not None and node.places is None:
                _through_host(arrays, lambda flats: node.gather_from_owners(flats, owners))
            elif node is not None:
                _through_host(arrays, lambda flats: node.gather_via_nodes(flats, owners))
            else:
                self._gather_host(arrays, owners)

    def with_chunk(self, chunk):
        """Return collectives on the same communicator that move ``chunk`` bytes per rank and round."""
        return ShardCollectives(self.mpi_comm, self._guard_of, nccl=self.nccl, chunk=chunk,
                                reducer_of=self._reducer_of)

    def wire_chosen(self, arrays):
        """Return the wire ``'auto'`` settled on for ``arrays`` (None: exact), or False while it is timing."""
        auto = self._autos.get(_set_key(arrays))
        return False if auto is None else auto['choice']

    def release(self):
        """Drop the reused buffers and plans."""
        self._bufs.clear()
        self._plans.clear()
        self._node = None

    def on_node_shared_memory(self):
        """Return whether the host shares move through node-shared memory (collective at first call)."""
        return self.size > 1 and self._node_shares() is not None

    # -- checks and plans --------------------------------------------------------------
    def _check(self, arrays, owners, what):
        if len(arrays) != len(owners):
            raise ValueError('rank {}: {} needs one owner per array; got {} arrays and {} owners'.format(
                self.rank, what, len(arrays), len(owners)))
        owners = tuple(int(r) for r in owners)
        for i, r in enumerate(owners):
            if not 0 <= r < self.size:
                raise ValueError('rank {}: {}: the owner of array {} is rank {}, outside 0..{}'.format(
                    self.rank, what, i, r, self.size - 1))
        return owners

    def _plan(self, kind, nbytes, owners, chunk):
        key = (kind, tuple(nbytes), owners, chunk)
        plan = self._plans.get(key)
        if plan is None:
            if len(self._plans) > 16:
                self._plans.clear()
            plan = self._plans[key] = share_plan(nbytes, owners, self.size, chunk)
        return plan

    def _buf(self, name, nbytes, xp=numpy):
        buf = self._bufs.get(name)
        if buf is None or buf.size < nbytes:
            buf = self._bufs[name] = xp.empty(max(nbytes, 8), dtype=numpy.uint8)
        return buf

    def _on_nccl(self, arrays):
        return self.nccl is not None and arrays and all(_arrays.is_device(a) for a in arrays)

    def _node_shares(self):
        """Return the :class:`NodeShares` of the reducer's window, or None (MPI messages).

        Collective at the first call (the reducer's set-up); the same answer on every rank.
        """
        reducer = self._reducer_of() if self._reducer_of is not None else None
        state = None if reducer is None else reducer.shares_window()
        if state is None:
            self._node = None
            return None
        node = self._node
        if node is None or node.state is not state:
            node = self._node = NodeShares(state, self._plan)
            if state.inter is not None:  # several nodes: where every rank sits (collective)
                across = ShardCollectives(state.inter, None)
                node.join_nodes(self.mpi_comm.allgather((state.local_rank, state.inter.Get_rank())),
                                across._mean_host, across._gather_host)
        return node if node.usable else None

    # -- the average ------------------------------------------------------------------------
    def _mean(self, arrays, owners, wire):
        codec = _codecs.codec_of(wire)
        if codec is None and self._on_nccl(arrays) and \
                all(a.dtype.kind == 'f' and a.dtype.itemsize >= 2 for a in arrays):
            self._mean_nccl(arrays, owners)
            return
        node = self._node_shares()
        if node is not None and node.places is None:  # shared memory is no wire: exact sums
            _through_host(arrays, lambda flats: node.mean_to_owners(flats, owners))
        elif node is not None and all(a.dtype.kind in 'fc' and a.dtype.itemsize >= 4 for a in arrays):
            _through_host(arrays, lambda flats: node.mean_via_nodes(flats, owners, codec, 1.0 / self.size))
        else:
            self._mean_host(arrays, owners, codec)

    def _mean_auto(self, arrays, owners):
        auto = self._autos.setdefault(_set_key(arrays), {'times': {}, 'calls': 0, 'choice': False})
        if auto['choice'] is False and not self._on_nccl(arrays):
            node = self._node_shares()
            if node is not None and node.places is None:
                auto['choice'] = None  # nothing crosses a wire: exact, without timing
        if auto['choice'] is not False:
            self._mean(arrays, owners, auto['choice'])
            return
        n = auto['calls']
        wire = _AUTO_CANDIDATES[n % len(_AUTO_CANDIDATES)]
        started = time.perf_counter()
        self._mean(arrays, owners, wire)
        took = time.perf_counter() - started
        times = auto['times']
        times[wire] = min(times.get(wire, took), took)
        auto['calls'] = n + 1
        if auto['calls'] < _AUTO_ROUNDS * len(_AUTO_CANDIDATES):
            return
        # Every rank decides on the same times: the slowest rank's of each wire.
        row = numpy.array([times[w] for w in _AUTO_CANDIDATES], dtype=numpy.float64)
        from mpi4py import MPI
        self.mpi_comm.Allreduce(MPI.IN_PLACE, row, MPI.MAX)
        best = int(numpy.argmin(row))
        auto['choice'] = _AUTO_CANDIDATES[best] if row[best] < 0.9 * row[0] else None

    def _mean_host(self, arrays, owners, codec, inv=None):
        staged = [_host_flat(a) for a in arrays]
        flats = [h for h, _ in staged]
        wire_sizes = [codec.itemsize if codec is not None and f.dtype.kind == 'f' else f.dtype.itemsize
                      for f in flats]
        nbytes = [f.size * w for f, w in zip(flats, wire_sizes)]
        rounds, counts = self._plan(('mean', None if codec is None else codec.name,
                                     tuple(f.dtype.str for f in flats)), nbytes, owners, self.chunk)
        size, rank, chunk = self.size, self.rank, self.chunk
        up = down = None
        inv = 1.0 / size if inv is None else inv
        if codec is not None and codec.prescale:
            up, down = _half.shared_factors(self.mpi_comm, flats, inv)
        sends = [self._buf('send', size * chunk), self._buf('send2', size * chunk)]
        recvs = [self._buf('recv', size * chunk), self._buf('recv2', size * chunk)]
        displs = [r * chunk for r in range(size)]

        def begin(k):
            pieces, count, send, recv = rounds[k], counts[k], sends[k & 1], recvs[k & 1]
            for r in range(size):
                base = r * chunk
                for i, start, stop, off in pieces[r]:
                    w = wire_sizes[i]
                    src = flats[i][start // w:stop // w]
                    dst = send[base + off:base + off + stop - start]
                    if codec is not None and src.dtype.kind == 'f':
                        codec.encode(dst.view(codec.storage), src, 1.0 if up is None else up[i])
                    else:
                        dst.view(src.dtype)[...] = src
            mine = count[rank]
            return self.mpi_comm.Ialltoallv([send, count, displs, _byte()],
                                            [recv, [mine] * size, displs, _byte()])

        def finish(k, request):
            request.Wait()
            recv = recvs[k & 1]
            for i, start, stop, off in rounds[k][rank]:
                w = wire_sizes[i]
                out = flats[i][start // w:stop // w]
                terms = [recv[s * chunk + off:s * chunk + off + stop - start] for s in range(size)]
                if codec is not None and out.dtype.kind == 'f':
                    wide = numpy.empty(out.size, numpy.float32)
                    codec.sum_terms(wide, [t.view(codec.storage) for t in terms])
                    _half.scale_into(out, wide, inv if down is None else down[i])
                else:
                    _sum_terms(out, [t.view(out.dtype) for t in terms], inv)

        _two_in_flight(len(rounds), begin, finish)
        for a, (h, copied) in zip(arrays, staged):
            if copied:
                _write_back(a, h)

    def _mean_nccl(self, arrays, owners):
        import cupy
        size, rank = self.size, self.rank
        groups = {}
        for i, a in enumerate(arrays):
            groups.setdefault(a.dtype.str, []).append(i)
        for dstr, idx in sorted(groups.items()):
            dt = numpy.dtype(dstr)
            flats = [arrays[i].reshape(-1) for i in idx]
            sub_owners = tuple(owners[i] for i in idx)
            rounds, _ = self._plan(('nccl', dstr), [f.nbytes for f in flats], sub_owners, self.chunk)
            elems = self.chunk // dt.itemsize
            send = self._buf('nccl_send', size * self.chunk, cupy)[:size * self.chunk].view(dt)
            recv = self._buf('nccl_recv', self.chunk, cupy)[:self.chunk].view(dt)
            w = dt.itemsize
            for pieces in rounds:
                for r in range(size):
                    for j, start, stop, off in pieces[r]:
                        send[r * elems + off // w:r * elems + (off + stop - start) // w] = \
                            flats[j][start // w:stop // w]
                self.nccl.reduce_scatter(send, recv, 'sum', what='mean_to_owners')
                for j, start, stop, off in pieces[rank]:
                    out = flats[j][start // w:stop // w]
                    cupy.multiply(recv[off // w:(off + stop - start) // w], dt.type(1.0 / size), out=out)

    # -- the way back ---------------------------------------------------------------------
    def _gather_host(self, arrays, owners):
        staged = [_host_flat(a) for a in arrays]
        flats = [h.view(numpy.uint8) if h.size else numpy.empty(0, numpy.uint8) for h, _ in staged]
        rounds, counts = self._plan('gather', [f.size for f in flats], owners, self.chunk)
        size, rank, chunk = self.size, self.rank, self.chunk
        sends = [self._buf('send', chunk), self._buf('send2', chunk)]
        recvs = [self._buf('recv', size * chunk), self._buf('recv2', size * chunk)]
        displs = [r * chunk for r in range(size)]

        def begin(k):
            pieces, count, send = rounds[k], counts[k], sends[k & 1]
            for i, start, stop, off in pieces[rank]:
                send[off:off + stop - start] = flats[i][start:stop]
            return self.mpi_comm.Iallgatherv([send, count[rank], _byte()], [recvs[k & 1], count, displs, _byte()])

        def finish(k, request):
            request.Wait()
            recv = recvs[k & 1]
            for r in range(size):
                if r == rank:
                    continue
                base = r * chunk
                for i, start, stop, off in rounds[k][r]:
                    flats[i][start:stop] = recv[base + off:base + off + stop - start]

        _two_in_flight(len(rounds), begin, finish)
        for a, (h, copied) in zip(arrays, staged):
            if copied:
                _write_back(a, h)

    def _gather_nccl(self, arrays, owners):
        import cupy
        size, rank, chunk = self.size, self.rank, self.chunk
        flats = [a.reshape(-1).view(numpy.uint8) if a.size else None for a in arrays]
        rounds, _ = self._plan('gather', [a.nbytes for a in arrays], owners, chunk)
        send = self._buf('nccl_send', size * chunk, cupy)
        recv = self._buf('nccl_recv', size * chunk, cupy)
        for pieces in rounds:
            for i, start, stop, off in pieces[rank]:
                send[off:off + stop - start] = flats[i][start:stop]
            self.nccl.allgather(send[:chunk], recv[:size * chunk], what='gather_from_owners')
            for r in range(size):
                if r == rank:
                    continue
                for i, start, stop, off in pieces[r]:
                    flats[i][start:stop] = recv[r * chunk + off:r * chunk + off + stop - start]


def _set_key(arrays):
    return len(arrays), sum(a.nbytes for a in arrays)


def _byte():
    from mpi4py import MPI
    return MPI.BYTE


def _host_flat(a):
    """Return (a flat C-contiguous host view or copy of ``a``, whether it is a copy to write back)."""
    if isinstance(a, numpy.ndarray) and a.flags.c_contiguous:
        return a.reshape(-1), False
    return _arrays.as_host(a).reshape(-1), True


def _write_back(a, host):
    a[...] = _arrays.like(host.reshape(a.shape), a)


def _through_host(arrays, run):
    """Call ``run`` on flat C-contiguous host views (or copies) of ``arrays``; write copies back."""
    staged = [_host_flat(a) for a in arrays]
    run([h for h, _ in staged])
    for a, (h, copied) in zip(arrays, staged):
        if copied:
            _write_back(a, h)
