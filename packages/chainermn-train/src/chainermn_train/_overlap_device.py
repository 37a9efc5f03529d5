"""Average CuPy gradients with NCCL on a side stream, bucket by bucket, while backward runs.

:class:`chainermn_train._overlap.BackwardOverlap` finds the moment each parameter's gradient
is final; this module does the device half.  When a bucket is complete, an event recorded
on the compute stream (the current one) makes a non-blocking side stream wait for the
gradients; on that stream each gradient is scaled by ``1/size`` into its place in one flat
device buffer and the bucket's slice is all-reduced (summed) in place by NCCL.  Nothing
blocks the host: backward keeps queueing kernels on the compute stream while NCCL works.
After backward, the host waits for the side stream with the communicator's bounded wait
(watchdog timeout, NCCL errors raised as ``CommunicationError``), so the gradients are
ready before any later kernel of the compute stream reads them.

Buckets are launched in index order on every rank, so the NCCL calls always match.  The
gradients are only read, and kept referenced until the side stream is done with them,
so the memory pool cannot hand their memory to a new array too early.  The scaling
happens before the sum, as in the plain device path; with one or two ranks the result has
the same bits as the plain path, with more ranks NCCL may sum a bucket in another order
than the whole buffer (last-bit differences).
"""

import numpy

from chainermn_comm import trace
from chainermn_train import _buckets
from chainermn_train import _tracing

__all__ = ['device_group', 'DeviceRun']


_COMMUNICATORS = object()  # device_group's default wire: the communicator's allreduce_grad_dtype


def device_group(communicator, params, wire=_COMMUNICATORS):
    """Return the NCCL group over all ranks that can average the CuPy gradients of ``params``, else None.

    Needs a communicator that all-reduces gradients with one NCCL communicator over all
    ranks (``pure_nccl``, ``single_node``), parameters that are CuPy arrays of one dtype that
    NCCL reduces on one device, and no wire (``wire``: the ``allreduce_grad_dtype`` or the
    built-in hook's) other than that dtype.
    """
    averaging = getattr(communicator, 'averaging', None)
    group = None if averaging is None else averaging.nccl
    if group is None or not params or group.size != communicator.size:
        return None
    try:
        import cupy
    except ImportError:
        return None
    arrays = [p.array for p in params]
    if not all(isinstance(a, cupy.ndarray) for a in arrays):
        return None
    dtypes = {a.dtype for a in arrays}
    devices = {a.device.id for a in arrays}
    if len(dtypes) != 1 or len(devices) != 1:
        return None
    dtype = dtypes.pop()
    wanted = getattr(communicator, 'allreduce_grad_dtype', None) if wire is _COMMUNICATORS else wire
    if wanted not in (None, 'auto') and (isinstance(wanted, str) or numpy.dtype(wanted) != dtype):
        return None  # another wire ('auto' keeps the gradients' dtype here: nothing is tuned on the device)
    from chainermn_comm.engine import nccl_dtype
    if nccl_dtype(dtype) is None:
        return None
    return group


class DeviceRun(_buckets.BucketFill):
    """One call: queue each complete bucket's scale and all-reduce on ``stream``; wait at the end."""

    def __init__(self, layout, group, scale, stream):
        import cupy
        super().__init__(layout)
        self._cupy = cupy
        self.group = group
        self.scale = scale
        self.stream = stream

    def start(self):
        """Nothing to start: buckets are queued from the hook, on the main thread."""

    def _take(self, i, grad):
        # Kept referenced until the side stream has read it.
        if grad is None:
            return self._cupy.zeros(self.layout.sizes[i], dtype=self.layout.flat.dtype)
        return grad

    def _bucket_full(self, b):
        self._take_in_order(self._launch)

    def _launch(self, b):
        cupy = self._cupy
        ready = cupy.cuda.Event(block=False, disable_timing=True)
        ready.record(cupy.cuda.get_current_stream())
        self.stream.wait_event(ready)
        members = self.layout.buckets[b]
        with self.stream:
            started = trace.begin(True) if trace.ON else None  # device time on the side stream
            for i in members:
                cupy.multiply(self.grads[i].reshape(-1), self.scale, out=self.layout.flat_views[i])
        lo, hi = self.layout.bucket_span(b)
        self.group.allreduce_async(self.layout.flat[lo:hi], self.stream,
                                   what='multi_node_mean_grad(overlap) bucket {}'.format(b))
        if started is not None:
            with self.stream:
                trace.end(started, _tracing.bucket_name(b), 'comm',
                          _tracing.bucket_args([self.grads[i] for i in members], None, self.call),
                          track='overlap')

    def join(self):
        """Queue what is left, then wait (bounded) until every bucket is averaged."""
        self._take_in_order(self._launch)
        if self.next_bucket != len(self.layout.buckets):
            raise RuntimeError('overlap: {} of {} buckets never completed; a gradient was not '
                               'reported'.format(len(self.layout.buckets) - self.next_bucket,
                                                 len(self.layout.buckets)))
        self.group.wait(self.stream, 'multi_node_mean_grad(overlap)')
        self.grads = [None] * len(self.grads)

    def abort(self):
        """After a failed backward: let queued work finish (bounded) before the gradients are freed."""
        if self.next_bucket:
            try:
                self.group.wait(self.stream, 'multi_node_mean_grad(overlap), after an error')
            except Exception:
                pass
        self.grads = [None] * len(self.grads)
