"""Collect each parameter's final gradient during backward and tell when its bucket is complete."""

__all__ = ['BucketFill']


class BucketFill:
    """Bookkeeping shared by the host and the device overlap runs of one backward.

    Subclasses say how a gradient is kept (``_take``) and what a complete bucket starts
    (``_bucket_full``); ``_take_in_order`` hands out complete buckets in index order, the
    order every rank must use for its collectives.
    """

    def __init__(self, layout):
        self.layout = layout
        n = len(layout.sizes)
        self.done = [False] * n
        self.grads = [None] * n  # each parameter's final gradient, as ``_take`` keeps it
        self.filled = 0
        self.pending = [len(members) for members in layout.buckets]
        self.next_bucket = 0  # the next bucket to hand out (index order on every rank)
        self.call = 0  # the communicator's collective number of this average (trace events)

    def on_final(self, i, grad):
        """Take parameter ``i``'s final gradient (None: zeros); report its bucket once complete.

        The gradient is only read, never written: Chainer may hand the same array to other
        variables (e.g. both inputs of an addition), so the average goes to the flat buffer.
        """
        if self.done[i]:
            return
        self.grads[i] = self._take(i, grad)
        self.done[i] = True
        self.filled += 1
        b = self.layout.bucket_of[i]
        self.pending[b] -= 1
        if self.pending[b] == 0:
            self._bucket_full(b)

    def _take_in_order(self, fn):
        """Call ``fn(b)`` for every complete bucket next in index order."""
        buckets = self.layout.buckets
        while self.next_bucket < len(buckets) and self.pending[self.next_bucket] == 0:
            self.next_bucket += 1
            fn(self.next_bucket - 1)

    def _take(self, i, grad):
        raise NotImplementedError

    def _bucket_full(self, b):
        raise NotImplementedError
