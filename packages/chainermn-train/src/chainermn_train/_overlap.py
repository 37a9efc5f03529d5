"""Run backward while the gradients that are already final are averaged across ranks, in buckets.

Before ``backward`` the graph is walked once from the loss to count, for every parameter,
the functions that consume it, and to order the parameters by when their gradient will
be final (Chainer runs backward from the highest-ranked function down, so a parameter is
final once its lowest-ranked consumer has run).  Consecutive parameters in that order
form buckets of about ``bucket_bytes``.

During ``backward`` a :class:`chainer.FunctionHook` counts consumers down in
``backward_postprocess``.  When a parameter's last consumer has run, its gradient is read
from the list Chainer accumulates it in (the caller's ``in_grad``; Chainer 7.8.1 writes
``param.grad`` only at the very end), summed the way Chainer sums it, and copied into the
parameter's place in one flat buffer.  A full bucket is handed to a background thread,
which averages it over all ranks (node-shared memory or MPI, as ``multi_node_mean_grad``)
while backward goes on.  Buckets are averaged in index order on every rank, so the
collectives always match.  After ``backward``, parameters that got no gradient take part
with zeros, the last buckets are averaged, and every ``param.grad`` becomes a view of the
flat buffer: no unpack.

Within a node (and across two nodes) each element is summed in the same rank order as on
the plain path, so the result has the same bits as ``backward`` followed by
``multi_node_mean_grad``.  Where the gradients are not all host arrays of one dtype, or
``allreduce_grad_dtype`` asks for another dtype, ``run_backward`` runs that plain path.
"""

import os
import sys
import threading
import zlib

import numpy

from chainermn_comm import _grad
from chainermn_comm import _shm_reduce
from chainermn_comm import _topology
from chainermn_comm._errors import CommunicationError

__all__ = ['BackwardOverlap', 'BUCKET_ENV', 'DEFAULT_BUCKET_BYTES']

#: Bytes of gradient per bucket that the background thread averages at once.
BUCKET_ENV = 'CHAINERMN_OVERLAP_BUCKET_BYTES'
DEFAULT_BUCKET_BYTES = 4 * 1024 * 1024


def _backprop_frame_code():
    """Return the code of Chainer's backward loop that calls backward_postprocess (or None)."""
    try:
        from chainer import _backprop
        return _backprop._backprop_to_all.__code__
    except (ImportError, AttributeError):
        return None


class BackwardOverlap:
    """Run ``loss.backward`` and leave every gradient of ``link`` averaged over all ranks.

    The result equals ``communicator.multi_node_mean_grad(link, zero_fill=True)`` after a
    plain ``loss.backward()``: parameters without a gradient get zeros and every gradient
    is averaged.  Creating the object is collective (it duplicates the MPI communicator
    that the background thread uses).
    """

    def __init__(self, communicator, link, bucket_bytes=None, chunk_bytes=None):
        if bucket_bytes is None:
            bucket_bytes = int(os.environ.get(BUCKET_ENV, DEFAULT_BUCKET_BYTES))
        if bucket_bytes < 1:
            raise ValueError('{} must be positive; got {}'.format(BUCKET_ENV, bucket_bytes))
        self.communicator = communicator
        self.link = link
        self.bucket_bytes = bucket_bytes
        self._mpi_comm = communicator.mpi_comm.Dup()
        self._reducer = _shm_reduce.NodeReducer(
            self._mpi_comm, _topology.detect_topology(self._mpi_comm),
            _grad.ChunkedReducer(self._mpi_comm, chunk_bytes=chunk_bytes))
        self._layout = None
        self._code = _backprop_frame_code()
        #: Parameters whose gradient was averaged while backward was still running, last call.
        self.early_params = 0

    def run_backward(self, loss, **backward_kwargs):
        """Run ``loss.backward(**backward_kwargs)`` and average the gradients across ranks."""
        params = [p for _, p in sorted(self.link.namedparams(), key=lambda kv: kv[0])
                  if p.array is not None]
        dtype = self._flat_dtype(params)
        if dtype is None:
            loss.backward(**backward_kwargs)
            self.communicator.multi_node_mean_grad(self.link, zero_fill=True)
            self.early_params = 0
            return
        index = {id(p.node): i for i, p in enumerate(params)}
        consumers, count, order = _consumers(loss, index, len(params))
        layout = self._layout_for(params, order, dtype)
        guard = getattr(self.communicator, '_guard', None)
        sig = (('params', tuple((p.array.shape, p.array.dtype.str) for p in params)),)
        if guard is None:
            self._run(loss, backward_kwargs, params, layout, index, consumers, count)
        else:
            with guard('multi_node_mean_grad(overlap)', sig):
                self._run(loss, backward_kwargs, params, layout, index, consumers, count)

    def free(self):
        """Release the duplicated MPI communicator and its shared memory (collective)."""
        if self._mpi_comm is not None:
            self._reducer.free()
            self._mpi_comm.Free()
            self._mpi_comm = None

    # -- internals ----------------------------------------------------------------
    def _flat_dtype(self, params):
        if self._mpi_comm.Get_size() == 1 or not params:
            return None
        if not all(isinstance(p.array, numpy.ndarray) for p in params):
            return None  # device arrays: the communicator's device path does the work
        dtypes = {p.array.dtype for p in params}
        if len(dtypes) != 1:
            return None
        dtype = dtypes.pop()
        wanted = getattr(self.communicator, 'allreduce_grad_dtype', None)
        if wanted is not None and numpy.dtype(wanted) != dtype:
            return None
        return dtype

    def _layout_for(self, params, order, dtype):
        key = (dtype.str, tuple(order), tuple(p.array.shape for p in params))
        if self._layout is None or self._layout.key != key:
            self._layout = _Layout(key, params, order, dtype, self.bucket_bytes)
        return self._layout

    def _check_same_layout(self, layout):
        from mpi4py import MPI
        h = numpy.array([layout.crc, -layout.crc], dtype=numpy.int64)
        self._mpi_comm.Allreduce(MPI.IN_PLACE, h, MPI.MAX)
        if h[0] != -h[1]:
            raise CommunicationError(
                'rank {}: overlap=True needs the same parameters used in the same order on every '
                'rank, but the ranks built different graphs this iteration (layout checksum {:#x}); '
                'use overlap=False for models whose graph depends on the data'.format(
                    self._mpi_comm.Get_rank(), layout.crc))

    def _run(self, loss, backward_kwargs, params, layout, index, consumers, count):
        self._check_same_layout(layout)
        run = _Run(layout, self._reducer)
        hook = _FinalGradHook(index, consumers, count, run.on_final, self._code)
        run.start()
        try:
            with hook:
                loss.backward(**backward_kwargs)
            self.early_params = run.filled
            for i, p in enumerate(params):
                if not run.done[i]:
                    run.on_final(i, p.grad)  # no consumer ran (unused, or zero_fill): zeros if None
        except BaseException:
            run.abort()
            raise
        run.join()
        for i, p in enumerate(params):
            p.grad = layout.view(i)


class _Layout:
    """Where each parameter's gradient lives in the flat buffer, and the buckets."""

    def __init__(self, key, params, order, dtype, bucket_bytes):
        self.key = key
        self.crc = zlib.crc32(repr(key).encode())
        sizes = [p.array.size for p in params]
        self.shapes = [p.array.shape for p in params]
        self.offset = [0] * len(params)
        self.bucket_of = [0] * len(params)
        self.buckets = []  # (start, stop, number of parameters)
        pos, start, members = 0, 0, 0
        for i in order:
            self.offset[i] = pos
            self.bucket_of[i] = len(self.buckets)
            pos += sizes[i]
            members += 1
            if (pos - start) * dtype.itemsize >= bucket_bytes:
                self.buckets.append((start, pos, members))
                start, members = pos, 0
        if members:
            self.buckets.append((start, pos, members))
        self.sizes = sizes
        self.flat = numpy.empty(pos, dtype=dtype)

    def view(self, i):
        o = self.offset[i]
        return self.flat[o:o + self.sizes[i]].reshape(self.shapes[i])


class _Run:
    """One call: fill buckets from the main thread, average them in a background thread."""

    def __init__(self, layout, reducer):
        self.layout = layout
        self.reducer = reducer
        self.done = [False] * len(layout.sizes)
        self.filled = 0
        self.pending = [n for _, _, n in layout.buckets]
        self.ready = [threading.Event() for _ in layout.buckets]
        self.aborted = False
        self.error = None
        self.thread = threading.Thread(target=self._work, name='chainermn-overlap', daemon=True)

    def start(self):
        self.thread.start()

    def on_final(self, i, grad):
        """Copy parameter ``i``'s final gradient (None: zeros) into its place; release its bucket."""
        if self.done[i]:
            return
        lay = self.layout
        o = lay.offset[i]
        dst = lay.flat[o:o + lay.sizes[i]]
        if grad is None:
            dst[...] = 0
        else:
            numpy.copyto(dst, numpy.asarray(grad).reshape(-1))
        self.done[i] = True
        self.filled += 1
        b = lay.bucket_of[i]
        self.pending[b] -= 1
        if self.pending[b] == 0:
            self.ready[b].set()

    def _work(self):
        try:
            for (start, stop, _), ev in zip(self.layout.buckets, self.ready):
                ev.wait()
                if self.aborted:
                    return
                self.reducer.mean([self.layout.flat[start:stop]])
        except BaseException as e:  # reported by join() in the main thread
            self.error = e

    def abort(self):
        """Stop the background thread without further collectives (backward failed here)."""
        self.aborted = True
        for ev in self.ready:
            ev.set()
        self.thread.join()

    def join(self):
        self.thread.join()
        if self.error is not None:
            raise self.error


def _consumers(loss, index, n):
    """Walk the graph from ``loss``: consumers per function, count and finishing order per parameter.

    Returns ``({id(function): parameter indices}, [consumers per parameter], order)`` where
    ``order`` lists parameter indices by when their gradient becomes final in backward.
    """
    per_func = {}
    count = [0] * n
    last_rank = [None] * n
    seen = set()
    stack = [loss.creator_node]
    while stack:
        f = stack.pop()
        if f is None or id(f) in seen:
            continue
        seen.add(id(f))
        hits = set()
        for x in f.inputs:
            i = index.get(id(x))
            if i is not None:
                hits.add(i)
            elif x.creator_node is not None:
                stack.append(x.creator_node)
        if hits:
            per_func[id(f)] = tuple(sorted(hits))
            for i in hits:
                count[i] += 1
                if last_rank[i] is None or f.rank < last_rank[i]:
                    last_rank[i] = f.rank
    # Highest last-consumer rank finishes first; unused parameters go last.
    order = sorted(range(n), key=lambda i: (last_rank[i] is None, -(last_rank[i] or 0), i))
    return per_func, count, order


def _hook_base():
    import chainer
    return chainer.FunctionHook


class _FinalGradHook(_hook_base()):
    """Report each parameter's gradient as soon as its last consumer's backward has run."""

    name = 'chainermn_overlap'

    def __init__(self, index, consumers, count, on_final, code):
        self._index = index
        self._consumers = consumers
        self._remaining = list(count)
        self._on_final = on_final
        self._code = code

    def backward_postprocess(self, function, in_data, out_grad):
        hits = self._consumers.get(id(function))
        if not hits:
            return
        final = set()
        for i in hits:
            self._remaining[i] -= 1
            if self._remaining[i] == 0:
                final.add(i)
        if not final:
            return
        frame = sys._getframe(1)
        if frame.f_code is not self._code:
            return  # not Chainer 7.8.1's backward loop: these gradients are taken after backward
        in_grad = frame.f_locals.get('in_grad')
        if in_grad is None:
            return
        from chainer import _backprop_utils
        for x in function.inputs:
            i = self._index.get(id(x))
            if i not in final or x not in in_grad:
                continue
            final.discard(i)
            gvar = _backprop_utils._reduce(in_grad[x])  # sums in place, as backward will later
            self._on_final(i, None if gvar is None else gvar.array)
