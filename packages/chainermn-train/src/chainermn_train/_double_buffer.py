"""Double buffering for the multi-node optimizer: all-reduce gradients in a background thread.

Each ``swap`` copies this iteration's gradients into a host buffer, starts their all-reduce on a
duplicate of the communicator's MPI communicator in a background thread, and puts the averaged
gradients of the previous iteration into the parameters.  The reduction thus overlaps with the
next forward/backward pass.  The first ``swap`` (and the first one after the set of parameters
changed) reduces synchronously, so the first update uses its own gradients; the second update uses
them again (its own gradients are still in flight).
"""

import atexit
import threading
import zlib

import numpy

from chainermn_comm import CommunicationError, engine, trace
from chainermn_train import _params
from chainermn_train import _tracing

__all__ = ['DoubleBufferingReducer', 'check_double_buffering_support']

_SUPPORTED = ('naive', 'flat (and every MPI-based communicator) when MPI provides MPI_THREAD_MULTIPLE',
              'pure_nccl')


def check_double_buffering_support(communicator):
    """Raise ValueError unless ``communicator`` can all-reduce from a background thread."""
    mpi_comm = getattr(communicator, 'mpi_comm', None)
    where = '; double buffering is supported by: ' + ', '.join(_SUPPORTED)
    if mpi_comm is None:
        raise ValueError('double_buffering=True needs a communicator with an MPI communicator '
                         '(mpi_comm); {} has none{}'.format(type(communicator).__name__, where))
    from mpi4py import MPI
    provided = MPI.Query_thread()
    if provided < MPI.THREAD_MULTIPLE:
        names = {MPI.THREAD_SINGLE: 'MPI_THREAD_SINGLE', MPI.THREAD_FUNNELED: 'MPI_THREAD_FUNNELED',
                 MPI.THREAD_SERIALIZED: 'MPI_THREAD_SERIALIZED'}
        raise ValueError(
            'rank {}: double_buffering=True on {} all-reduces in a background thread and needs '
            'MPI_THREAD_MULTIPLE, but this MPI provides {} (set mpi4py.rc.thread_level = "multiple" '
            'before importing mpi4py.MPI, or use an MPI built with thread support){}'.format(
                communicator.rank, type(communicator).__name__, names.get(provided, provided), where))


class _Buffers:
    """Host copies of a list of gradients, laid end to end in one array of ``dtype``."""

    def __init__(self, layout, dtype):
        flat = numpy.empty(sum(int(numpy.prod(s)) for s, _ in layout), dtype=dtype)
        self.views = []  # one flat view per gradient: the reducer scales float16 per array
        off = 0
        for s, _ in layout:
            n = int(numpy.prod(s))
            self.views.append(flat[off:off + n])
            off += n

    def pack(self, grads):
        for view, g in zip(self.views, grads):
            view[...] = _to_host(g).reshape(-1)

    def unpack(self, params):
        for view, p in zip(self.views, params):
            view = view.reshape(p.grad.shape)
            if isinstance(p.grad, numpy.ndarray):
                numpy.copyto(p.grad, view, casting='unsafe')
            else:
                p.grad[...] = _to_device_like(view.astype(p.grad.dtype, copy=False), p.grad)


def _to_host(a):
    if isinstance(a, numpy.ndarray):
        return a
    import chainer
    return numpy.asarray(chainer.backend.CpuDevice().send(a))


def _to_device_like(host, like):
    import chainer
    return chainer.backend.get_device_from_array(like).send(host)


class DoubleBufferingReducer:
    """Two sets of host gradient buffers; one is reduced in the background while the other is used."""

    def __init__(self, communicator, zero_fill=True, hook=None):
        check_double_buffering_support(communicator)
        self._communicator = communicator
        self._zero_fill = zero_fill
        # The same reducer as multi_node_mean_grad (node-shared memory first), so the bits match, on a
        # duplicate of the communicator: the averaging interface's reducer for the background thread.
        self._thread_reducer = engine.thread_reducer(communicator)
        self._reducer = self._thread_reducer.reducer
        self._red_dtype = engine.grad_dtype(communicator)  # 'auto': the plain path's choice
        if hook is not None:  # a built-in wire (hooks.WireHook); 'auto' stays exact here
            self._red_dtype = None if engine.is_auto(hook.wire) else hook.wire
        self._sig = None
        self._ready = None      # buffers holding averaged gradients of the previous iteration
        self._spare = None      # buffers free for the next copy
        self._thread = None
        self._error = None
        self._in_flight = None  # buffers being reduced by the thread
        self._atexit = False
        self._key = (None, 0)   # (gradient signature, its checksum: the agreement check's key)

    def _params(self, target):
        params = []
        for _, p in _params.sorted_params(target):
            if p.array is None:
                continue
            if p.grad is None:
                if not self._zero_fill:
                    continue
                p.grad = p.device.xp.zeros_like(p.array)
            params.append(p)
        return params

    def _new_buffers(self, params):
        layout = [(p.grad.shape, p.grad.dtype) for p in params]
        dtypes = {d for _, d in layout}
        # Keep the gradients' own dtype on the host: a float16 wire is cast (and scaled) by the
        # reducer, as in the plain path, rather than cast here unscaled.
        return _Buffers(layout, dtypes.pop() if len(dtypes) == 1 else numpy.dtype(numpy.float64))

    def _reduce(self, bufs, call):
        started = trace.now() if trace.ON else None
        self._reducer.mean(bufs.views, dtype=self._red_dtype)
        if started is not None:
            trace.record('multi_node_mean_grad', 'comm', started, trace.now(),
                         _tracing.bucket_args(bufs.views, self._red_dtype, call))

    def _run(self, bufs, call):
        trace.set_thread_name('double_buffering')
        try:
            self._reduce(bufs, call)
        except BaseException as e:  # reported to the main thread in finish()
            self._error = e

    def finish(self):
        """Wait for the background all-reduce; return the buffers it reduced (or None)."""
        t = self._thread
        if t is None:
            return None
        timeout = getattr(self._communicator, 'timeout', 0) or None
        t.join(timeout)
        if t.is_alive():
            raise CommunicationError(
                'rank {}: the background gradient all-reduce of double buffering did not finish '
                'within {} s; another rank is probably stuck or dead'.format(
                    self._communicator.rank, timeout))
        self._thread = None
        bufs, self._in_flight = self._in_flight, None
        if self._error is not None:
            err, self._error = self._error, None
            raise err
        return bufs

    def swap(self, target):
        """Start reducing ``target``'s gradients; replace them by the previous averaged ones.

        Runs under the communicator's agreement check (one small message; on up to 64 ranks it
        also carries the live straggler detection's arrival times): the ranks agree that they
        double-buffer the same gradients before any of them starts the background reduction.
        """
        params = self._params(target)
        sig = tuple((p.grad.shape, p.grad.dtype.str) for p in params)
        if sig != self._key[0]:
            self._key = (sig, zlib.crc32(repr(sig).encode()))  # ints only: hashed alike everywhere
        guard = engine.guarded_call(self._communicator, 'multi_node_mean_grad(double_buffering)',
                                    (('params', sig),), key=self._key[1])
        with guard:
            self._swap(params, sig, getattr(guard, 'collective_seq', 0))

    def _swap(self, params, sig, call):
        if sig != self._sig:
            self.finish()
            self._sig = sig
            first = self._new_buffers(params)
            first.pack([p.grad for p in params])
            self._reduce(first, call)
            first.unpack(params)
            self._ready = first
            self._spare = self._new_buffers(params)
            return
        done = self.finish()
        if done is not None:
            self._spare, self._ready = self._ready, done
        bufs = self._spare
        bufs.pack([p.grad for p in params])
        self._spare = None
        self._in_flight = bufs
        self._thread = threading.Thread(target=self._run, args=(bufs, call),
                                        name='chainermn-double-buffer', daemon=True)
        self._thread.start()
        if not self._atexit:
            atexit.register(self._finish_quietly)
            self._atexit = True
        self._ready.unpack(params)
        # After this swap the ready set is in use; the next finish() returns the in-flight one,
        # and the ready set becomes the spare.
        self._spare = self._ready

    def _finish_quietly(self):
        try:
            self.finish()
        except BaseException:
            pass
