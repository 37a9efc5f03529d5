"""``overlap=True`` with a communication hook that is not a built-in wire: one hook call per bucket.

Each parameter's final gradient is copied into its place in the flat buffer; when a bucket is
complete (and every bucket before it), the hook is called on the main thread with the bucket's
views, shaped like the parameters, and leaves them averaged in place.  Buckets are handed to the
hook in index order on every rank, so its collectives match; what backward has not completed
when it ends is handed over after it, still one bucket per call.  A hook never runs in a
background thread: it may keep state and use the communicator without locks.
"""

import numpy

from chainermn_comm import hooks, trace
from chainermn_train import _buckets
from chainermn_train import _tracing

__all__ = ['HookRun']


class HookRun(_buckets.BucketFill):
    """One call of ``hook`` per complete bucket, in index order, on the main thread."""

    mode = 'inline'

    def __init__(self, layout, average, names):
        super().__init__(layout)
        #: The model's averaging interface (``chainermn_comm.engine.ModelAverage``) that holds the hook.
        self.average = average
        self.hook = average.hook
        self.names = names

    def start(self):
        """Nothing to start: buckets are averaged from the hook, on the main thread."""

    def _take(self, i, grad):
        view = self.layout.flat_views[i]
        if grad is None:
            view[...] = 0
        else:
            view[...] = numpy.asarray(grad).reshape(-1)
        return view

    def _bucket_full(self, b):
        self._take_in_order(self._call)

    def _call(self, b):
        layout = self.layout
        members = layout.buckets[b]
        grads = [layout.view(i) for i in members]
        started = trace.now() if trace.ON else None
        self.average.mean_bucket(hooks.GradBucket(grads, [self.names[i] for i in members],
                                                  index=b, count=len(layout.buckets)))
        if started is not None:
            args = _tracing.bucket_args(grads, None, self.call)
            args['hook'] = str(self.hook)
            trace.record(_tracing.bucket_name(b), 'comm', started, trace.now(), args)
        for i in members:
            self.grads[i] = None

    def join(self):
        """Hand the buckets left to the hook, one call each."""
        self._take_in_order(self._call)
        if self.next_bucket != len(self.layout.buckets):
            raise RuntimeError('overlap: {} of {} buckets never completed; a gradient was not '
                               'reported'.format(len(self.layout.buckets) - self.next_bucket,
                                                 len(self.layout.buckets)))

    def abort(self):
        """After a failed backward: nothing runs in the background, nothing to stop."""
