"""Average gradients through memory shared by the ranks of a node, one cache-sized chunk at a time.

The gradients are cut into chunks of ``chunk_bytes`` (as if all arrays were laid end to
end) and every chunk into one *share* per rank of the node.  Each rank owns a staging
segment of two chunks in an MPI shared-memory window.  For every chunk:

1. each rank copies the parts of the chunk that other ranks own into its segment;
2. barrier;
3. each rank sums its own share: its own gradient plus every peer's staged copy, read
   straight from the peers' segments, always in local-rank order; the sum goes into its segment (for the peers) and,
   scaled by ``1/size``, back into its own gradient; with several nodes the shares are
   first all-reduced across nodes over MPI;
4. barrier (shared with step 1 of the next chunk, which stages into the other half);
5. each rank copies the peers' shares, scaled, into its own gradients.

With several nodes, the cross-node sum of my share of chunk ``k`` is nonblocking: it is on
the wire while this rank stages chunk ``k + 1`` and unpacks chunk ``k - 1`` (which every
owner finished before the last barrier), so the casts and copies hide behind the link.

On one node the unpack of chunk ``k`` follows its barrier at once, while the sums are in cache.
A 2-byte reduction dtype (``allreduce_grad_dtype=float16`` or ``'bfloat16'``) is a format for
the wire, and shared memory is no wire: the node stages and sums in float32, and only the
cross-node sum of each share travels in 16 bits.  Its owner casts the node's float32 sum once
(float16: times the power of two of ``reduce.half.shared_factors``), the nodes' terms are added in
float32 and rounded once (not with two nodes: ``reduce.half``), and the owner writes the result,
back in float32, where its peers copy it from.  Each value is cast to and from the wire
format once per node instead of once per rank, and the sums lose nothing inside a node.

Every byte is read and written once in main memory, the staging stays in cache (no pack/unpack,
no copy through MPI's buffers); each element's sum is computed by its owner: the same bits everywhere.
"""

import operator

import numpy

from chainermn_comm.reduce import codecs as _codecs
from chainermn_comm.reduce import chunked as _grad
from chainermn_comm.reduce import half as _half
from chainermn_comm.reduce.node_plan import make_plan as _make_plan
from chainermn_comm.reduce import stream as _stream
from chainermn_comm import settings
from chainermn_comm._errors import CommunicationError
from chainermn_comm.protocol import SHM_CHUNK_BYTES_ENV, SHM_REDUCE_ENV

__all__ = ['NodeReducer', 'SHM_ENV', 'SHM_CHUNK_ENV', 'DEFAULT_SHM_CHUNK_BYTES', 'SHM_CHUNK_CHOICES']

#: Set to 0 to average gradients with MPI messages only.
SHM_ENV = SHM_REDUCE_ENV
#: Bytes of gradient per chunk of the shared-memory average.
SHM_CHUNK_ENV = SHM_CHUNK_BYTES_ENV
DEFAULT_SHM_CHUNK_BYTES = 1024 * 1024
#: The chunk sizes the tuner may choose from (``reduce.tune``) when the size is not pinned (512 KiB,
#: twice the barriers, never won in ``bench/tune_cost.py``: settable, not tried).
SHM_CHUNK_CHOICES = (1024 * 1024, 2048 * 1024)
_PLAN_CACHE_SIZE = 64
_STR = operator.attrgetter('str')
_SIZE = operator.attrgetter('size')


def _shm_enabled():
    return settings.read(SHM_ENV)


class NodeReducer:
    """Average host gradients in place: node-shared memory when ranks share a node, MPI otherwise.

    ``bcast`` and the fallback ``mean`` go to ``chunked`` (a :class:`ChunkedReducer`; one
    over ``mpi_comm`` with default sizes when None).
    The first ``mean`` is collective over ``mpi_comm`` and decides, identically on every
    rank, whether the shared-memory path can run: more than one rank per node, the same
    number of ranks on every node, and every node's ranks really sharing memory.
    """

    def __init__(self, mpi_comm, topology, chunked=None, chunk_bytes=None):
        #: Whether the chunk size was given (argument or ``CHAINERMN_SHM_CHUNK_BYTES``): not tuned.
        self.chunk_pinned = chunk_bytes is not None or settings.read(SHM_CHUNK_ENV) is not None
        if chunk_bytes is None:
            chunk_bytes = settings.read(SHM_CHUNK_ENV, DEFAULT_SHM_CHUNK_BYTES)
        if chunk_bytes < 64:
            raise ValueError('{} must be at least 64 bytes; got {}'.format(SHM_CHUNK_ENV, chunk_bytes))
        self.mpi_comm = mpi_comm
        self.topology = topology
        self.chunked = chunked if chunked is not None else _grad.ChunkedReducer(mpi_comm)
        self.chunk_bytes = chunk_bytes // 16 * 16
        # The window holds two chunks of the largest size the tuner may pick.
        self._window_chunk = self.chunk_bytes if self.chunk_pinned else max(
            (self.chunk_bytes,) + SHM_CHUNK_CHOICES) // 16 * 16
        #: Average through shared memory when it is usable (the tuner may switch it off).
        self.use_shared = True
        #: The tuning whose settled choice is set now (``reduce.tune.TunedMean``); None: unknown.
        self.tuned_by = None
        #: Whether ``mean`` (without ``out``) is exactly ``chunked.mean`` now: MPI messages only
        #: (None before the first ``mean``); the averaging interface then calls that directly.
        self.messages_only = None
        self._state = None  # None: undecided; False: MPI only; _Shared: shared memory ready
        self._plans = {}

    @property
    def uses_shared_memory(self):
        """Whether ``mean`` runs through node-shared memory (None before the first ``mean``)."""
        return None if self._state is None else self._state is not False and self.use_shared

    @property
    def shared_usable(self):
        """Whether the shared-memory path is set up and usable (None before the first ``mean``)."""
        return None if self._state is None else self._state is not False

    def configure(self, shared=None, chunk_bytes=None):
        """Switch the shared-memory path on or off and set its chunk size (None: unchanged).

        Neither changes the bits of a float32 average of two ranks, nor, for the chunk size,
        of any average (the sums' order does not depend on chunks).
        """
        self.tuned_by = None
        if shared is not None:
            self.use_shared = bool(shared)
            if self._state is not None:
                self.messages_only = self._state is False or not self.use_shared
        if chunk_bytes is not None:
            chunk_bytes = int(chunk_bytes) // 16 * 16
            if not 64 <= chunk_bytes <= self._window_chunk:
                raise ValueError('shared-memory chunk size {} is outside [64, {}]'.format(
                    chunk_bytes, self._window_chunk))
            self.chunk_bytes = chunk_bytes

    def bcast(self, arrays, root=0):
        """Overwrite ``arrays`` on every rank with root's values (MPI, in chunks)."""
        self.chunked.bcast(arrays, root=root)

    def mean(self, arrays, dtype=None, out=None):
        """Average the C-contiguous host ``arrays`` over all ranks, in place or into ``out``.

        ``dtype`` is the dtype the sums run in (the arrays' own, or ``out``'s, when None).  A
        2-byte ``dtype`` is what crosses between nodes; within a node sums run in float32
        (see the module doc).
        ``out`` (a list of C-contiguous arrays of the same sizes) receives the averages and
        leaves ``arrays`` untouched; through shared memory this costs no extra copy.
        """
        if out is None:
            out = arrays
        elif len(out) != len(arrays) or any(a.size != o.size for a, o in zip(arrays, out)):
            raise ValueError('mean: out must hold one array of the same size per input array; got '
                             'sizes {} for inputs of sizes {}'.format(
                                 [o.size for o in out], [a.size for a in arrays]))
        size = self.mpi_comm.Get_size()
        if size > 1 and self._state is None:
            self._state = self._setup()
            self.messages_only = self._state is False or not self.use_shared
        if size == 1 or self._state is False or not self.use_shared:
            if out is not arrays:
                for a, o in zip(arrays, out):
                    numpy.copyto(o.reshape(-1), a.reshape(-1), casting='unsafe')
            if size > 1:
                self.chunked.mean(out, dtype=dtype)
            return
        groups = {}
        keys = _grad.REDUCTION_KEYS  # reduction_key's answers (no call per array once known)
        for a, o in zip(arrays, out):
            key = keys.get(o.dtype if dtype is None else dtype)
            if key is None:
                key = _grad.reduction_key(dtype, o.dtype)
            pair = groups.get(key)
            if pair is None:
                pair = groups[key] = ([], [])
            pair[0].append(a.reshape(-1))
            pair[1].append(o.reshape(-1))
        for red_dtype in (groups if len(groups) == 1 else sorted(groups, key=_STR)):
            src, dst = groups[red_dtype]
            self._mean_group(red_dtype, src, dst)

    def shares_window(self):
        """Return the node-shared state when the path is usable, else None.

        For the reduce-scatter and all-gather of owned arrays (``reduce.shard_node``): the same
        conditions as the average's (``CHAINERMN_SHM_REDUCE``, more than one rank and the same
        number on every node, every node's ranks really sharing memory).  The state's ``local``
        and ``inter`` (None on one node) are the node's and the cross-node communicators.  Sets
        the path up at the first call of ``mean`` or this (collective over ``mpi_comm``); the
        answer is the same on every rank.
        """
        if self.mpi_comm.Get_size() == 1:
            return None
        if self._state is None:
            self._state = self._setup()
            self.messages_only = self._state is False or not self.use_shared
        return self._state or None

    def release_unused(self):
        """Drop what only other chunk sizes use: MPI buffers and shared-memory plans (after tuning)."""
        self.chunked.release_unused()
        self._plans = {k: v for k, v in self._plans.items() if k[2] == self.chunk_bytes}

    def free(self):
        """Release the shared window and the node communicators (collective)."""
        state, self._state = self._state, None
        self.messages_only = None
        self._plans.clear()
        if state:
            state.free()

    # -- set-up ---------------------------------------------------------------
    def _setup(self):
        from mpi4py import MPI
        comm, topo = self.mpi_comm, self.topology
        counts = {}
        for key in topo.hosts:
            counts[key] = counts.get(key, 0) + 1
        usable = _shm_enabled() and min(counts.values()) > 1 and len(set(counts.values())) == 1
        if not comm.allreduce(usable, op=MPI.LAND):  # the switch may differ between ranks
            return False
        # A simulated node (CHAINERMN_RANKS_PER_NODE) must lie inside one real shared-memory node.
        real = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())
        try:
            real_group, comm_group = real.Get_group(), comm.Get_group()
            real_ranks = set(MPI.Group.Translate_ranks(
                real_group, list(range(real.Get_size())), comm_group))
            real_group.Free()
            comm_group.Free()
        finally:
            real.Free()
        mine = {r for r, key in enumerate(topo.hosts) if key == topo.hosts[comm.Get_rank()]}
        if not comm.allreduce(mine <= real_ranks, op=MPI.LAND):
            return False
        return _Shared(comm, topo, 2 * self._window_chunk)

    # -- the average ------------------------------------------------------------
    def _plan(self, key):
        """Make (and keep) the plan of ``key``: (reduction dtype, array sizes, chunk bytes)."""
        if len(self._plans) >= _PLAN_CACHE_SIZE:
            self._plans.clear()
        red, st = numpy.dtype(key[0]), self._state
        plan = self._plans[key] = _make_plan(key[1], key[2] // red.itemsize, st.local_size,
                                             st.local_rank, st.views(red))
        return plan

    def _mean_group(self, red_dtype, src, dst):
        state = self._state
        flight = state.flight
        codec = red_dtype if isinstance(red_dtype, _codecs.Codec) else None
        if codec is not None:  # float32 in shared memory; 16 bits only on the wire (module doc)
            red_dtype = numpy.dtype(numpy.float32)
        key = (red_dtype.str, tuple(map(_SIZE, src)), self.chunk_bytes)
        plan = self._plans.get(key) or self._plan(key)
        if not plan:
            return
        scale = 1.0 / self.mpi_comm.Get_size()
        scratch = state.scratches.get(red_dtype) if red_dtype in state.scratches else state.scratch(red_dtype)
        if flight is None:
            _mean_on_node(state, plan, src, dst, [scale] * len(src), scratch)
            return
        ups, post = None, 1.0
        if codec is not None and codec.prescale:  # a power of two per array before the cast (``reduce.half``)
            ups, downs = _half.shared_factors(self.mpi_comm, src, scale,
                                              _stream.polite_wait if self.chunked.polite else None)
        elif codec is not None:  # bfloat16: float32's range; the owners scale the sums
            ups = downs = [1.0] * len(src)
            post = scale
        else:
            downs = [scale] * len(src)
        wire = None if codec is None else state.wire(codec)
        sync = state.sync
        _stage(plan[0], src, None)
        sync()
        poke = flight.poke
        prev = None
        for k, chunk in enumerate(plan):
            _sum_local(chunk, src, dst, downs, scratch, False)
            busy = chunk.own_region.size > 0
            if busy:  # the link carries my share while the CPU stages and unpacks
                if wire is None:
                    flight.start(chunk.own_region)
                elif flight.one_phase:  # two nodes: float32 sums into my share; words sent in place
                    words = flight.send_view(chunk.own_region.size, codec)
                    flight.start(_to_wire(chunk, ups, words, codec), codec, post, out=chunk.own_region)
                else:
                    flight.start(_to_wire(chunk, ups, wire, codec), codec, post)
            if k + 1 < len(plan):
                _stage(plan[k + 1], src, poke if busy else None)
            if busy:
                flight.step()
            if prev is not None:
                _unpack(prev, dst, None if wire is not None else downs, poke if busy else None)
            if busy:
                flight.wait()
                if wire is None:
                    for j, a, b, acc, _, _ in chunk.own:
                        _write_back(dst[j][a:b], acc, downs[j])
                elif flight.one_phase:
                    _from_sums(chunk, downs, dst)
                else:
                    _from_wire(chunk, downs, wire, dst, codec)
            sync()
            prev = chunk
        _unpack(prev, dst, None if wire is not None else downs, None)
        sync()  # nobody stages the next group or call while a peer still reads this one


def _mean_on_node(state, plan, src, dst, downs, scratch):
    """The average of ranks that all share one node: stage, sum my share, barrier, unpack."""
    sync = state.sync
    _stage(plan[0], src, None)
    sync()
    last = len(plan) - 1
    for k, chunk in enumerate(plan):
        _sum_local(chunk, src, dst, downs, scratch, True)
        if k < last:
            _stage(plan[k + 1], src, None)
        sync()
        _unpack(chunk, dst, downs, None)
    sync()  # nobody stages the next group or call while a peer still reads this one


class _Shared:
    """The node and cross-node communicators and the shared staging window."""

    def __init__(self, comm, topo, nbytes):
        from mpi4py import MPI
        self.local = comm.Split(topo.node_id, comm.Get_rank())
        self.inter = comm.Split(topo.intra_rank, comm.Get_rank()) if topo.inter_size > 1 else None
        self.flight = _half.InFlightSum(self.inter) if self.inter is not None else None
        self.local_rank = self.local.Get_rank()
        self.local_size = self.local.Get_size()
        # Room for one share of one chunk (the window holds two chunks per rank) and its wire copy.
        share = nbytes // 2 // self.local_size + 64
        self._scratch = numpy.empty(share, dtype=numpy.uint8)
        self.scratches = {}  # dtype -> the scratch buffer viewed as it
        self._wire = numpy.empty(share // 4 + 16, dtype=numpy.float16)
        try:
            self.win = MPI.Win.Allocate_shared(nbytes, 1, comm=self.local)
        except MPI.Exception as e:
            raise CommunicationError(
                'rank {}: could not allocate {} bytes of node-shared memory for the gradient '
                'average ({}); set {}=0 to average with MPI messages only'.format(
                    comm.Get_rank(), nbytes, e, SHM_ENV)) from e
        self.segments = []
        for r in range(self.local_size):
            buf, _ = self.win.Shared_query(r)
            self.segments.append(numpy.frombuffer(buf, dtype=numpy.uint8, count=nbytes))
        self.win.Lock_all()

    def scratch(self, dtype):
        """Return a private buffer as large as one share of a chunk, viewed as ``dtype`` (kept in ``scratches``)."""
        n = self._scratch.size // dtype.itemsize * dtype.itemsize
        view = self.scratches[dtype] = self._scratch[:n].view(dtype)
        return view

    def wire(self, codec):
        """Return a private buffer of ``codec``'s words as long (in elements) as one float32 share."""
        return self._wire.view(codec.storage)

    def views(self, dtype):
        """Return every local rank's segment viewed as ``dtype``."""
        return [s.view(dtype) for s in self.segments]

    def sync(self):
        """Make this rank's stores visible and wait for every rank of the node."""
        self.win.Sync()
        self.local.Barrier()
        self.win.Sync()

    def free(self):
        self.win.Unlock_all()
        self.win.Free()
        self.local.Free()
        if self.inter is not None:
            self.inter.Free()


def _stage(chunk, g, poke):
    """Copy the parts of ``chunk`` that peers own into my segment."""
    for j, a, b, dst in chunk.stage:
        numpy.copyto(dst, g[j][a:b], casting='unsafe')
        if poke is not None:
            poke()


def _sum_local(chunk, src, dst, downs, scratch, write_back):
    """Sum my share of ``chunk`` over the node's ranks into my segment (and my gradients if ``write_back``)."""
    for j, a, b, acc, terms, _ in chunk.own:
        mine = src[j][a:b]
        if mine.dtype != acc.dtype:
            # Bring my term to the reduction dtype, like the peers' staged terms, without
            # touching my gradient.
            mine_term = scratch[:b - a]
            numpy.copyto(mine_term, mine, casting='unsafe')
        else:
            mine_term = mine
        # Sum in local-rank order whoever owns the share, so that the bits do not depend on
        # how the arrays fall into chunks and shares.
        t0, t1 = terms[0], terms[1]
        numpy.add(mine_term if t0 is None else t0, mine_term if t1 is None else t1, out=acc)
        for k in range(2, len(terms)):
            t = terms[k]
            numpy.add(acc, mine_term if t is None else t, out=acc)
        if write_back:
            numpy.multiply(acc, downs[j], out=dst[j][a:b], casting='unsafe')


def _to_wire(chunk, ups, wire, codec):
    """Cast my share's float32 node sums, times ``ups[j]``, into ``wire`` (``codec``'s words); return its view."""
    for j, a, b, acc, _, off in chunk.own:
        codec.encode(wire[off:off + b - a], acc, ups[j])
    return wire[:chunk.own_region.size]


def _from_wire(chunk, downs, wire, dst, codec):
    """Write the cross-node sums, times ``downs[j]``, into my segment (for peers) and my gradients."""
    for j, a, b, acc, _, off in chunk.own:
        codec.decode(acc, wire[off:off + b - a], downs[j])
        numpy.copyto(dst[j][a:b], acc, casting='unsafe')


def _from_sums(chunk, downs, dst):
    """Scale the cross-node float32 sums in my segment by ``downs[j]`` and copy them into my gradients."""
    for j, a, b, acc, _, _ in chunk.own:
        if downs[j] != 1.0:
            numpy.multiply(acc, downs[j], out=acc)
        numpy.copyto(dst[j][a:b], acc, casting='unsafe')


def _write_back(dst, total, down):
    numpy.multiply(total, down, out=dst, casting='unsafe')  # inlined in _sum_local and _unpack


def _unpack(chunk, g, downs, poke):
    """Copy the owners' results of ``chunk`` into my gradients (times ``downs[j]`` unless None)."""
    for j, a, b, src in chunk.unpack:
        if downs is None:
            numpy.copyto(g[j][a:b], src, casting='unsafe')
        else:
            numpy.multiply(src, downs[j], out=g[j][a:b], casting='unsafe')  # _write_back
        if poke is not None:
            poke()
