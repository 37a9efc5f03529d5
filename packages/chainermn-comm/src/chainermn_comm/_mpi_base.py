"""All communicator methods implemented on MPI for host (NumPy) arrays."""

import functools

import numpy

from chainermn_comm import _arrays, _factory, _finalize, _topology, threads, trace, voice
from chainermn_comm.reduce import dtypes as _dtypes
from chainermn_comm.reduce import node_shared as _shm_reduce
from chainermn_comm.reduce import wire as _wire
from chainermn_comm._errors import CommunicationError
from chainermn_comm.reduce.model_collectives import ModelCollectives
from chainermn_comm._objects import ObjectCalls, SendFailed
from chainermn_comm.reduce.wire import FUSED_KINDS as _FUSED_KINDS
from chainermn_comm.reduce.wire import MAX_PIECE as _MAX_PIECE
from chainermn_comm.reduce.wire import OBJ_OPS as _OBJ_OPS
from chainermn_comm.reduce.wire import ArrayMessage, op_name
from chainermn_comm.reduce.wire import Fail as _Fail
from chainermn_comm.reduce.wire import as_bytes as _bytes
from chainermn_comm.reduce.wire import empty as _empty
from chainermn_comm.reduce.wire import raise_if_failed as _raise_if_failed
from chainermn_comm.reduce.wire import spec as _spec
from chainermn_comm.reduce.wire import split_into as _split_into
from chainermn_comm.communicator_base import CommunicatorBase
from chainermn_comm.guard import PAYLOAD_BYTES, CallGuard, stable_code

__all__ = ['MpiCommunicatorBase', 'ArrayMessage', 'op_name']

class MpiCommunicatorBase(ModelCollectives, ObjectCalls, CommunicatorBase):
    """Communicator whose every method runs over MPI on host memory.

    Arrays from CuPy are staged through host memory; GPU communicators override
    the device paths.
    """

    #: Human-readable name used in messages; subclasses override.
    name = 'mpi'

    def __init__(self, mpi_comm=None, allreduce_grad_dtype=None, batched_copy=False, timeout=None):
        # The set-up create_communicator runs (settings and name checked on every rank together,
        # the job's voice): a direct constructor, as v7's code calls it, gets the same communicator.
        mpi_comm = _factory.set_up_for(type(self), mpi_comm, allreduce_grad_dtype)
        from mpi4py import MPI
        from mpi4py.util import pkl5
        if not isinstance(mpi_comm, MPI.Intracomm):
            raise TypeError('mpi_comm must be an mpi4py intracommunicator (e.g. MPI.COMM_WORLD); '
                            'got {}'.format(type(mpi_comm).__name__))
        self._mpi_comm = mpi_comm
        self._pkl = pkl5.Intracomm(mpi_comm)
        self._rank = mpi_comm.Get_rank()
        self._size = mpi_comm.Get_size()
        self._topology = _topology.detect_topology(mpi_comm)
        threads.size_thread_pools(mpi_comm)  # BLAS/OpenMP pools: this rank's share of its CPUs
        self.allreduce_grad_dtype = _dtypes.validate_grad_dtype(allreduce_grad_dtype)
        self.batched_copy = bool(batched_copy)
        self._init_kwargs = dict(allreduce_grad_dtype=allreduce_grad_dtype,
                                 batched_copy=batched_copy, timeout=timeout)
        # Real host names for the straggler line (simulated nodes are named node0, node1, ...).
        hosts = None if _topology.simulated() else self._topology.hosts
        self._guard = CallGuard(mpi_comm, timeout=timeout, hosts=hosts)
        #: How messages name this rank: 'rank W', on a sub-communicator with its own rank beside it.
        self._me = voice.label(self._rank, self._guard.world_of)
        self._reducer = _shm_reduce.NodeReducer(mpi_comm, self._topology)
        self._averaging = self._make_averaging(MpiCommunicatorBase)
        #: Whether ``finalize`` frees ``mpi_comm`` (true for communicators made by ``split``).
        self._owns_mpi_comm = False
        trace.communicator_created(mpi_comm)

    config_names = ('allreduce_grad_dtype', 'batched_copy')   # Chainer v7's set_config / get_config

    def __repr__(self):
        return '<{} rank={} size={} intra={}/{} inter={}/{}>'.format(
            type(self).__name__, self.rank, self.size, self.intra_rank, self.intra_size,
            self.inter_rank, self.inter_size)

    # -- topology ---------------------------------------------------------
    @property
    def rank(self):
        return self._rank

    @property
    def size(self):
        return self._size

    @property
    def intra_rank(self):
        return self._topology.intra_rank

    @property
    def intra_size(self):
        return self._topology.intra_size

    @property
    def inter_rank(self):
        return self._topology.inter_rank

    @property
    def inter_size(self):
        return self._topology.inter_size

    @property
    def mpi_comm(self):
        return self._mpi_comm

    @property
    def timeout(self):
        """Watchdog timeout in seconds (0 means off)."""
        return self._guard.timeout
    # -- argument checks ----------------------------------------------------
    def _check_rank(self, value, what):
        if isinstance(value, bool) or not isinstance(value, (int, numpy.integer)):
            raise TypeError('{}: {} must be an int rank in [0, {}); got {!r}'.format(
                self._me, what, self._size, value))
        if not 0 <= int(value) < self._size:
            raise ValueError('{}: {}={} is out of range; valid ranks are 0..{}'.format(
                self._me, what, value, self._size - 1))
        return int(value)

    def _check_tag(self, tag):
        from mpi4py import MPI
        if isinstance(tag, bool) or not isinstance(tag, (int, numpy.integer)) or tag < 0:
            raise ValueError('{}: tag must be a non-negative int; got {!r}'.format(self._me, tag))
        ub = MPI.COMM_WORLD.Get_attr(MPI.TAG_UB)
        if ub is not None and tag > ub:
            raise ValueError('{}: tag {} exceeds MPI_TAG_UB={}'.format(self._me, tag, ub))
        return int(tag)

    def _root_arg(self, root):
        """Return (root as an int, None), or (None, the error) when ``root`` is not a valid rank."""
        try:
            return self._check_rank(root, 'root'), None
        except (TypeError, ValueError) as e:
            return None, e

    def _rooted(self, name, root, problem=None, sig=()):
        """Return (``root`` as an int or None, the guard of collective ``name`` from ``root``).

        The ranks agree on the call, its root and ``sig`` (more arguments that must agree)
        first; a rank whose root (or other argument: ``problem``) is invalid joins that check
        with an 'invalid input' signature and raises there, so that every rank fails together
        instead of the others waiting for it.
        """
        root, bad = self._root_arg(root)
        return root, self._guard(name, (('root', root),) + tuple(sig), problem=bad or problem)

    def _max_buf_len_problem(self, max_buf_len):
        """Return the error for an invalid ``max_buf_len`` of ``bcast``, or None."""
        if max_buf_len is None:
            return None
        if isinstance(max_buf_len, bool) or not isinstance(max_buf_len, (int, numpy.integer)) \
                or max_buf_len <= 0:
            return ValueError('{}: max_buf_len must be a positive int (bytes per piece) or '
                              'None; got {!r}'.format(self._me, max_buf_len))
        return None

    def _host_array(self, x, what):
        """Return ``x`` as a contiguous host array or raise TypeError naming ``what``."""
        if _arrays.is_array(x):
            if x.dtype.hasobject:
                raise TypeError('{}: {} cannot send arrays of dtype {} (they hold Python objects, '
                                'shape {}); send Python objects with send_obj, bcast_obj, gather_obj or allgather_obj'.format(
                                    self._me, what, x.dtype, x.shape))
            _arrays.check_current_device(x, what, self._rank)
            return _arrays.as_host(x)
        if isinstance(x, (int, float, complex, numpy.number, numpy.bool_)):
            return numpy.asarray(x)
        raise TypeError('{}: {} needs a numpy/cupy ndarray or a scalar; got {}'.format(
            self._me, what, _arrays.describe(x)))

    # -- point to point -----------------------------------------------------
    def send(self, data, dest, tag):
        dest = self._check_rank(dest, 'dest')
        tag = self._check_tag(tag)
        is_tuple = isinstance(data, (tuple, list))
        items = list(data) if is_tuple else [data]
        hosts = [self._host_array(x, 'send') for x in items]
        header = ArrayMessage([_spec(h) for h in hosts], is_tuple, [_arrays.is_device(x) for x in items])
        with self._guard('send', (), collective=False, dest=dest, tag=tag,
                         shapes=[h.shape for h in hosts]):
            self._pkl.send(header, dest=dest, tag=tag)
            for h in hosts:
                self._send_bytes(_bytes(h), dest, tag)

    def _send_bytes(self, b, dest, tag):
        for start in range(0, max(1, b.size), _MAX_PIECE):
            self._mpi_comm.Send(b[start:start + _MAX_PIECE], dest=dest, tag=tag)

    def recv(self, source, tag):
        source = self._check_rank(source, 'source')
        tag = self._check_tag(tag)
        with self._guard('recv', (), collective=False, source=source, tag=tag):
            header = self._recv_header(source, tag)
            outs = []
            for spec, on_device in zip(header.specs, header.on_device):
                out = _empty(spec)
                self._recv_bytes(_bytes(out), source, tag, spec)
                outs.append(_arrays.to_device_if(out, on_device))
        if header.is_tuple:
            return tuple(outs)
        return outs[0]

    def _recv_header(self, source, tag):
        """Receive the ArrayMessage that precedes the bytes of ``send``; raise if an object came instead."""
        header = self._pkl.recv(source=source, tag=tag)
        if not isinstance(header, ArrayMessage):
            raise CommunicationError(
                '{}: recv(source={}, tag={}) got a Python object sent by send_obj ({}); '
                'receive it with recv_obj, or send arrays with send'.format(
                    self._me, source, tag, type(header).__name__))
        return header

    def _recv_bytes(self, b, source, tag, spec):
        from mpi4py import MPI
        status = MPI.Status()
        for start in range(0, max(1, b.size), _MAX_PIECE):
            piece = b[start:start + _MAX_PIECE]
            self._mpi_comm.Recv(piece, source=source, tag=tag, status=status)
            got = status.Get_count(MPI.BYTE)
            if got != piece.size:
                raise CommunicationError(
                    '{}: recv from rank {} (tag {}) expected {} bytes for an array of shape {} '
                    'dtype {} but got {}; sender and receiver are out of step'.format(
                        self._me, source, tag, piece.size, spec[0], spec[1], got))

    def recv_obj(self, source, status=None, tag=None):
        """Receive a picklable object from ``source``; ``tag`` None (or ``MPI.ANY_TAG``) takes any tag.

        ``status`` is an ``mpi4py.MPI.Status`` to fill (source, tag, byte count), as
        ``mpi4py``'s ``recv`` does.  Chainer v7's order is ``(source, status, tag)``; the
        reference's ``recv_obj(source, tag)`` also works, because an int in the second place
        is taken as the tag.
        """
        from mpi4py import MPI
        status, tag = _wire.recv_obj_status_and_tag(self._rank, status, tag)
        source = self._check_rank(source, 'source')
        tag = MPI.ANY_TAG if tag is None else self._check_tag(tag)
        # With any tag, the bytes that follow an array header carry the header's own tag: read
        # it from a status even when the caller passed none.
        st = status if status is not None else MPI.Status()
        with self._guard('recv_obj', (), collective=False, source=source, tag=tag):
            obj = self._pkl.recv(source=source, tag=tag, status=st)
        if isinstance(obj, SendFailed):
            raise CommunicationError(obj.message)
        if isinstance(obj, ArrayMessage):
            # Consume the array bytes that follow the header so the sender is not left blocked
            # and the next message from this peer is read correctly.
            got_tag = st.Get_tag()
            with self._guard('recv_obj', (), collective=False, source=source, tag=got_tag):
                for spec in obj.specs:
                    self._recv_bytes(_bytes(_empty(spec)), source, got_tag, spec)
            raise CommunicationError(
                '{}: recv_obj(source={}, tag={}) got an array message sent by send; '
                'receive it with recv'.format(self._me, source, got_tag))
        return obj

    # -- collectives on arrays ------------------------------------------------
    def bcast(self, data, max_buf_len=None, root=0):
        # The pieces of the broadcast follow max_buf_len: the ranks must agree on it.
        problem = self._max_buf_len_problem(max_buf_len)
        root, call = self._rooted('bcast', root, problem, sig=() if problem or max_buf_len is None
                                  else (('max_buf_len', int(max_buf_len)),))
        with call:
            if self._rank == root:
                try:
                    host = self._host_array(data, 'bcast')
                    header = (_spec(host), _arrays.is_device(data))
                except TypeError as e:
                    host, header = None, _Fail(str(e))
            else:
                host = None
                header = None
            header = self._mpi_comm.bcast(header, root=root)
            _raise_if_failed([header], self._rank, 'bcast from root {}'.format(root))
            spec, on_device = header
            out = host if self._rank == root else _empty(spec)
            piece = _MAX_PIECE if max_buf_len is None else min(int(max_buf_len), _MAX_PIECE)
            b = _bytes(out)
            for start in range(0, b.size, piece):
                self._mpi_comm.Bcast(b[start:start + piece], root=root)
        # Every rank returns the array type root sent (CuPy when root's data was on a GPU).
        return _arrays.to_device_if(out, on_device)

    def gather(self, data, root=0):
        root, call = self._rooted('gather', root)
        with call:
            host, headers = self._exchange_specs(data, 'gather')
            shapes = {h for h in headers}
            if len(shapes) != 1:
                raise ValueError(
                    '{}: gather needs the same shape and dtype on every rank; got {}'.format(
                        self._me, ', '.join('{}: {} {}'.format(voice.label(r, self._guard.world_of),
                                                                h[0], h[1]) for r, h in enumerate(headers))))
            if self._rank == root:
                out = numpy.empty((self._size,) + tuple(host.shape), dtype=host.dtype)
                self._mpi_comm.Gather(_bytes(host), _bytes(out), root=root)
                return _arrays.like(out, data)
            self._mpi_comm.Gather(_bytes(host), None, root=root)
            return None

    def _exchange_specs(self, data, what):
        """Allgather every rank's (shape, dtype); raise on all ranks if any input is invalid."""
        try:
            host = self._host_array(data, what)
            mine = _spec(host)
        except TypeError as e:
            host, mine = None, _Fail(str(e))
        headers = self._mpi_comm.allgather(mine)
        _raise_if_failed(headers, self._rank, what)
        return host, headers

    def allgather(self, x):
        with self._guard('allgather', ()):
            host, headers = self._exchange_specs(x, 'allgather')
            outs = [_empty(h) for h in headers]
            counts = [o.nbytes for o in outs]
            recv = numpy.empty(sum(counts), dtype=numpy.uint8)
            self._mpi_comm.Allgatherv(_bytes(host), [recv, counts])
            return tuple(_arrays.like(o, x) for o in _split_into(recv, counts, outs))

    def scatter(self, xs, root=0):
        root, call = self._rooted('scatter', root)
        with call:
            header = None
            hosts = None
            if self._rank == root:
                try:
                    if not isinstance(xs, (tuple, list)) and not (_arrays.is_array(xs) and xs.ndim > 0):
                        raise TypeError('{}: scatter needs a tuple/list of arrays (or an array whose '
                                        'first axis has length {}) on root; got {}'.format(
                                            self._me, self._size, _arrays.describe(xs)))
                    if len(xs) != self._size:
                        raise TypeError('{}: scatter needs exactly {} items on root (one per rank); '
                                        'got {}'.format(self._me, self._size, len(xs)))
                    hosts = [self._host_array(x, 'scatter') for x in xs]
                    items = xs if isinstance(xs, (tuple, list)) else [xs]
                    header = ([_spec(h) for h in hosts], all(_arrays.is_device(x) for x in items))
                except TypeError as e:
                    header = _Fail(str(e))
            header = self._mpi_comm.bcast(header, root=root)
            _raise_if_failed([header], self._rank, 'scatter from root {}'.format(root))
            specs, on_device = header
            out = _empty(specs[self._rank])
            if self._rank == root:
                counts = [h.nbytes for h in hosts]
                send = numpy.concatenate([_bytes(h) for h in hosts]) if hosts else numpy.empty(0, numpy.uint8)
                self._mpi_comm.Scatterv([send, counts], _bytes(out), root=root)
            else:
                self._mpi_comm.Scatterv(None, _bytes(out), root=root)
            return _arrays.to_device_if(out, on_device)

    def alltoall(self, xs):
        with self._guard('alltoall', ()):
            try:
                if not isinstance(xs, (tuple, list)):
                    raise TypeError('{}: alltoall needs a tuple/list of {} arrays; got {}'.format(
                        self._me, self._size, _arrays.describe(xs)))
                if len(xs) != self._size:
                    raise TypeError('{}: alltoall needs exactly {} arrays (one per rank); got {}'.format(
                        self._me, self._size, len(xs)))
                hosts = [self._host_array(x, 'alltoall') for x in xs]
                mine = [_spec(h) for h in hosts]
            except TypeError as e:
                hosts, mine = None, [_Fail(str(e))] * self._size
            # headers[r] came from rank r; a rank with invalid input sent a _Fail to every rank.
            headers = self._mpi_comm.alltoall(mine)
            _raise_if_failed(headers, self._rank, 'alltoall')
            send_counts = [h.nbytes for h in hosts]
            send = numpy.concatenate([_bytes(h) for h in hosts])
            outs = [_empty(h) for h in headers]
            recv_counts = [o.nbytes for o in outs]
            recv = numpy.empty(sum(recv_counts), dtype=numpy.uint8)
            self._mpi_comm.Alltoallv([send, send_counts], [recv, recv_counts])
            return tuple(_arrays.like(o, xs[0]) for o in _split_into(recv, recv_counts, outs))

    def allreduce(self, data, op='sum'):
        try:
            mpi_op = _dtypes.reduction_op(op)
            host = self._host_array(data, 'allreduce')
            _dtypes.check_numeric(host, 'allreduce', self._rank, op=op)
        except (TypeError, ValueError) as e:
            with self._guard('allreduce', problem=e):
                pass  # entering raises ``e`` (CommunicationError on ranks that disagree)
        name = op_name(op, mpi_op)
        sig = (('shape', host.shape), ('dtype', host.dtype.str), ('op', name))
        key = (host.shape, stable_code(host.dtype), stable_code(name))
        # Integers reduce to the same bits in any order; floats only with two terms (a + b == b + a),
        # so a fused result is bit for bit what MPI's own reduction gives.
        fuse = host.nbytes <= PAYLOAD_BYTES and host.dtype.kind in _FUSED_KINDS.get(name, '') and \
            (self._size == 2 or host.dtype.kind in 'iu')
        with self._guard('allreduce', sig, key=key, payload=host if fuse else None) as guard:
            out = numpy.empty_like(host)
            rows = guard.take_payload() if fuse else None
            if rows is not None:
                _wire.reduce_rows(rows, out, name)
            else:
                self._allreduce_host(host, out, mpi_op)
        return _arrays.like(out, data)

    def _allreduce_host(self, src, out, mpi_op):
        try:
            self._mpi_comm.Allreduce(src, out, mpi_op)
        except Exception:  # MPI.Exception, or mpi4py's KeyError/ValueError for an unknown typecode
            if src.dtype != numpy.float16:
                raise
            # This MPI library cannot reduce half precision: reduce in float32 (same on every rank).
            wide = numpy.empty(src.shape, numpy.float32)
            self._mpi_comm.Allreduce(src.astype(numpy.float32), wide, mpi_op)
            out[...] = wide

    # -- collectives on objects (bcast_obj, gather_obj, allgather_obj: ObjectCalls)
    def allreduce_obj(self, obj, op='sum'):
        problem = None
        if op not in _OBJ_OPS:
            problem = ValueError('{}: unsupported allreduce_obj op {!r}; use one of {}'.format(
                self._me, op, ', '.join(sorted(_OBJ_OPS))))
        pickled, bad = self._prepickle(obj, 'allreduce_obj(op={!r})'.format(op))
        with self._guard('allreduce_obj', (('op', op),), problem=problem or bad):
            objs = self._pkl.allgather(pickled)
        return functools.reduce(_OBJ_OPS[op], objs)

    # -- communicator management -----------------------------------------------
    def split(self, color, key):
        from mpi4py import MPI
        with self._guard('split', ()):
            new = self._mpi_comm.Split(color, key)
        if new == MPI.COMM_NULL:  # color=MPI.UNDEFINED: this rank is in no new communicator
            return None
        with _factory.already_set_up(new):   # this communicator's set-up holds for its parts
            sub = type(self)(mpi_comm=new, **self._init_kwargs)
        sub._owns_mpi_comm = True
        return sub

    # -- life cycle -----------------------------------------------------------
    def finalize(self):
        if isinstance(self._guard, _finalize.FinalizedGuard):
            return
        # First tell the other ranks: one that waits in a call this rank will never join ends
        # the job instead of waiting for the watchdog (the frees below are collective too).
        self._guard.leave('called finalize()')
        self._release()
        guard, self._guard = self._guard, _finalize.FinalizedGuard(self)
        self._averaging.guard = self._guard
        _finalize.close_guard(guard)
        if self._owns_mpi_comm:
            _finalize.free_comm(self._mpi_comm)

    def _release(self):
        """Free shared memory, sub-communicators and buffers (collective); subclasses extend it."""
        self._reducer = None
        self._averaging.free()
