"""An NCCL communicator over an MPI communicator: created lazily, watched by a background thread."""

import time

import numpy

from chainermn_comm._errors import CommunicationError
from chainermn_comm.gpu import _layout
from chainermn_comm.gpu import _nccl_watch

__all__ = ['NcclGroup', 'nccl_dtype', 'nccl_op', 'wait_stream', 'NCCL_OPS']

NCCL_OPS = ('sum', 'prod', 'max', 'min')

#: Fraction of the watchdog timeout an NCCL call may take before it is aborted and reported.
WAIT_FRACTION = 0.9


def nccl_dtype(dtype):
    """Return the NCCL data type constant for ``dtype``, or None if NCCL cannot reduce it.

    ``'bfloat16'`` (or ml_dtypes' bfloat16) is ``NCCL_BFLOAT16`` where CuPy has it (NCCL >= 2.10).
    """
    from cupy.cuda import nccl
    if _layout.dtype_name(dtype) == _layout.BFLOAT16:
        return getattr(nccl, 'NCCL_BFLOAT16', None)
    table = {'int8': nccl.NCCL_INT8, 'uint8': nccl.NCCL_UINT8, 'int32': nccl.NCCL_INT32,
             'uint32': nccl.NCCL_UINT32, 'int64': nccl.NCCL_INT64, 'uint64': nccl.NCCL_UINT64,
             'float16': nccl.NCCL_FLOAT16, 'float32': nccl.NCCL_FLOAT32, 'float64': nccl.NCCL_FLOAT64}
    return table.get(numpy.dtype(dtype).name)


def nccl_op(op):
    """Return the NCCL reduction constant for ``op`` ('sum', 'prod', 'max', 'min'), else None."""
    from cupy.cuda import nccl
    if not isinstance(op, str):
        return None
    return {'sum': nccl.NCCL_SUM, 'prod': nccl.NCCL_PROD, 'max': nccl.NCCL_MAX,
            'min': nccl.NCCL_MIN}.get(op.lower())


def wait_stream(stream, limit, poll_error, what):
    """Wait for the work queued on ``stream`` without blocking forever.

    Polls an event; between polls calls ``poll_error()`` (raises on an NCCL error).  Raises
    TimeoutError naming ``what`` after ``limit`` seconds (no limit when ``limit`` <= 0).
    """
    import cupy
    ev = cupy.cuda.Event(block=False, disable_timing=True)
    ev.record(stream)
    start = time.monotonic()
    spins = 0
    pause = 0.0
    while not ev.done:
        poll_error()
        spins += 1
        if spins > 200:
            pause = min(1e-3, max(2e-5, pause * 2))
            time.sleep(pause)
        if limit > 0 and time.monotonic() - start > limit:
            raise TimeoutError('{} did not complete within {:.1f} s'.format(what, limit))


class NcclGroup:
    """One NCCL communicator over ``mpi_comm`` (one rank per GPU), built on first use.

    The device current at first use is the one NCCL binds to; later calls on another
    device raise instead of corrupting memory.  After an error or a timeout the NCCL
    communicator is aborted and every later call raises.
    """

    def __init__(self, mpi_comm, label, owner):
        self.mpi_comm = mpi_comm
        self.label = label
        self._owner = owner          # the chainermn communicator (rank, timeout, guard)
        self._comm = None
        self._device = None
        self._broken = None
        self._closed = None  # after close(): how this group described itself

    @property
    def size(self):
        return self.mpi_comm.Get_size()

    @property
    def rank(self):
        return self.mpi_comm.Get_rank()

    def _describe(self):
        return 'rank {} (NCCL {} rank {} of {})'.format(self._owner.rank, self.label, self.rank, self.size)

    def get(self):
        """Return the NCCL communicator, creating it on the current device the first time."""
        import cupy
        from cupy.cuda import nccl
        if self._closed is not None:
            from chainermn_comm._finalize import CommunicatorFinalizedError
            raise CommunicatorFinalizedError(
                '{}: the NCCL communicator was released by finalize(); create a new chainermn '
                'communicator'.format(self._closed))
        if self._broken is not None:
            raise CommunicationError('{}: NCCL communicator is unusable after an earlier failure ({}); '
                                     'create a new chainermn communicator'.format(self._describe(),
                                                                                  self._broken))
        dev = cupy.cuda.runtime.getDevice()
        if self._comm is None:
            uid = nccl.get_unique_id() if self.rank == 0 else None
            uid = self.mpi_comm.bcast(uid, root=0)
            try:
                self._comm = nccl.NcclCommunicator(self.size, uid, self.rank)
            except nccl.NcclError as e:
                raise CommunicationError(
                    '{}: creating the NCCL communicator on GPU {} failed: {}. NCCL needs one rank per '
                    'GPU: select the device with cupy.cuda.Device(comm.intra_rank).use() before the '
                    'first communication'.format(self._describe(), dev, e)) from e
            self._device = dev
        elif dev != self._device:
            raise RuntimeError(
                '{}: the current CUDA device is {} but this communicator\'s NCCL communicator was '
                'created on device {}; keep one device per process (cupy.cuda.Device(comm.intra_rank)'
                '.use() before the first communication)'.format(self._describe(), dev, self._device))
        return self._comm

    def _abort(self, what, err):
        """Abort NCCL, remember the failure and return the message that names it."""
        comm, self._comm = self._comm, None
        self._broken = '{}: {}'.format(what, err)
        if comm is not None:
            try:
                comm.abort()
            except Exception:
                pass
        return ('{}: NCCL {} failed: {}. A rank may have died or hung; check the other ranks\' '
                'output'.format(self._describe(), what, err))

    def _fail(self, what, err):
        """Abort NCCL, remember the failure and raise CommunicationError naming ``what``."""
        raise CommunicationError(self._abort(what, err)) from err

    def wait(self, stream, what):
        """Block until ``stream`` is done, polling NCCL's async error; bounded by the watchdog timeout."""
        from cupy.cuda import nccl
        comm = self._comm
        if comm is None:
            if self._broken is None and self._closed is None:
                return  # nothing was ever queued
            self.get()  # raises: the watchdog aborted it, or finalize() released it
        try:
            wait_stream(stream, self._limit(), comm.check_async_error, 'NCCL ' + what)
        except (nccl.NcclError, TimeoutError) as e:
            self._fail(what, e)

    def _limit(self):
        timeout = self._owner.timeout
        return timeout * WAIT_FRACTION if timeout > 0 else 0.0

    def _call(self, what, fn, stream=None, watch=True):
        """Run ``fn(nccl_comm, stream_ptr)`` on ``stream`` (default: current) and return at once.

        Later work on the same stream runs after the call, as CUDA orders it; the host does not
        wait.  With ``watch`` the process's NCCL watchdog thread follows the call: an NCCL error
        or a call that does not finish within the limit aborts this NCCL communicator, is
        reported naming ``what``, and makes the next call raise CommunicationError.
        """
        from cupy.cuda import nccl
        import cupy
        comm = self.get()
        if stream is None:
            stream = cupy.cuda.get_current_stream()
        try:
            fn(comm, stream.ptr)
        except nccl.NcclError as e:
            self._fail(what, e)
        if watch:
            ev = cupy.cuda.Event(block=False, disable_timing=True)
            ev.record(stream)
            _nccl_watch.watchdog().watch(self, ev, what, self._limit(), comm.check_async_error,
                                         self._abort)

    # -- collectives on contiguous device arrays ------------------------------
    def allreduce(self, send, recv, op='sum', what='allreduce', dtype=None):
        """All-reduce ``send`` into ``recv`` (may be the same array); ``dtype`` overrides the arrays'
        (``'bfloat16'`` for uint16 words of that wire), as in :meth:`reduce` and :meth:`reduce_scatter`."""
        dt, red = _dtype_op(send, op, dtype)
        self._call(what, lambda c, s: c.allReduce(send.data.ptr, recv.data.ptr, send.size, dt, red, s))

    def allreduce_async(self, buf, stream, op='sum', what='allreduce'):
        """Queue an in-place all-reduce of contiguous ``buf`` on ``stream`` and return at once.

        Call :meth:`wait` on ``stream`` before the result is used (it bounds the wait by the
        watchdog timeout and turns NCCL errors into ``CommunicationError``).
        """
        dt, red = _dtype_op(buf, op)
        self._call(what, lambda c, s: c.allReduce(buf.data.ptr, buf.data.ptr, buf.size, dt, red, s),
                   stream=stream, watch=False)

    def reduce(self, send, recv, root, op='sum', what='reduce', dtype=None):
        """Reduce ``send`` into ``recv`` on ``root`` (``recv`` is ignored elsewhere)."""
        dt, red = _dtype_op(send, op, dtype)
        rptr = recv.data.ptr if recv is not None else send.data.ptr
        self._call(what, lambda c, s: c.reduce(send.data.ptr, rptr, send.size, dt, red, root, s))

    def bcast(self, buf, root, what='bcast'):
        """Broadcast contiguous ``buf`` (any dtype, sent as bytes) from ``root`` in place."""
        from cupy.cuda import nccl
        nbytes = buf.size * buf.dtype.itemsize
        self._call(what, lambda c, s: c.bcast(buf.data.ptr, nbytes, nccl.NCCL_UINT8, root, s))

    def reduce_scatter(self, send, recv, op='sum', what='reduce_scatter', dtype=None):
        """Reduce ``send`` (``size * recv.size`` elements) and leave shard ``rank`` in ``recv``."""
        dt, red = _dtype_op(send, op, dtype)
        if send.size != recv.size * self.size:
            raise ValueError('reduce_scatter needs {} * {} elements; got {}'.format(
                self.size, recv.size, send.size))
        self._call(what, lambda c, s: c.reduceScatter(send.data.ptr, recv.data.ptr, recv.size, dt, red, s))

    def allgather(self, send, recv, what='allgather'):
        """Gather every rank's ``send`` into ``recv`` (``size * send.size`` elements)."""
        from cupy.cuda import nccl
        nbytes = send.size * send.dtype.itemsize
        if recv.size * recv.dtype.itemsize != nbytes * self.size:
            raise ValueError('allgather needs a receive buffer of {} bytes; got {}'.format(
                nbytes * self.size, recv.size * recv.dtype.itemsize))
        self._call(what, lambda c, s: c.allGather(send.data.ptr, recv.data.ptr, nbytes, nccl.NCCL_UINT8, s))

    def destroy(self):
        """Free the NCCL communicator (collective in NCCL's sense: call on every rank)."""
        comm, self._comm = self._comm, None
        _nccl_watch.watchdog().forget(self)
        if comm is not None:
            comm.destroy()

    def close(self):
        """Destroy the NCCL communicator for good: later calls raise CommunicatorFinalizedError."""
        if self._closed is None:
            self._closed = self._describe()
        self.destroy()


def _dtype_op(arr, op, dtype=None):
    dt = nccl_dtype(arr.dtype if dtype is None else dtype)
    red = nccl_op(op)
    if dt is None:
        raise TypeError('NCCL cannot reduce dtype {} (shape {}){}'.format(
            arr.dtype if dtype is None else dtype, arr.shape,
            '; bfloat16 needs NCCL >= 2.10 and a CuPy that has NCCL_BFLOAT16' if dtype is not None else ''))
    if red is None:
        raise ValueError('NCCL supports the reductions {}; got {!r}'.format(', '.join(NCCL_OPS), op))
    return dt, red
