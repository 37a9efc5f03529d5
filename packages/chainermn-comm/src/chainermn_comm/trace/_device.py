"""Device time for trace events: CUDA event pairs, resolved later instead of waiting for them.

``begin`` records a CUDA event on the current stream; ``end`` records a second one and queues the
pair.  A pair is turned into an event of the ring once its end event has completed on the GPU:
a few are looked at (``cudaEventQuery``, no wait) whenever a pair is queued, and the rest at
flush.  Nothing synchronises per iteration.  Device times are placed on the host clock through
one anchor per device: an event recorded and waited for once, at the first pair, whose host time
is then known; a later event's time is the anchor's plus ``cupy.cuda.get_elapsed_time``.
"""

import collections
import threading
import time

__all__ = ['DeviceTimer', 'MAX_PENDING']

#: Pairs queued at most; beyond this the oldest is waited for (a stream that never completes
#: must not make the queue grow without bound).
MAX_PENDING = 4096
#: Pairs looked at (without waiting) each time one is queued.
_POLL = 4


class DeviceTimer:
    """Queue CUDA event pairs and turn them into complete events of ``ring``."""

    def __init__(self, ring):
        self.ring = ring
        self.pending = collections.deque()
        self._anchors = {}  # device id -> (CUDA event, perf_counter_ns when it completed)
        self._lock = threading.Lock()

    def begin(self):
        """Record and return the start event of a pair on the current stream."""
        import cupy
        dev = cupy.cuda.runtime.getDevice()
        if dev not in self._anchors:
            anchor = cupy.cuda.Event()
            anchor.record()
            anchor.synchronize()  # once per device: ties the device clock to the host clock
            self._anchors[dev] = (anchor, time.perf_counter_ns())
        start = cupy.cuda.Event()
        start.record()
        return dev, start

    def end(self, token, name, cat, args, tid):
        """Record the end event of ``token``'s pair and queue the pair as event ``name``."""
        import cupy
        stop = cupy.cuda.Event()
        stop.record()
        with self._lock:
            self.pending.append((token, stop, name, cat, args, tid))
            self._resolve(_POLL, wait=len(self.pending) > MAX_PENDING)

    def drain(self):
        """Wait for every queued pair and turn it into an event (at flush).

        Skipped when the lock stays taken (a signal handler interrupted :meth:`end`).
        """
        if not self._lock.acquire(timeout=0.5):
            return
        try:
            self._resolve(len(self.pending), wait=True)
        finally:
            self._lock.release()

    def _resolve(self, most, wait):
        import cupy
        pending = self.pending
        while pending and most > 0:
            (dev, start), stop, name, cat, args, tid = pending[0]
            if not stop.done:
                if not wait:
                    return
                stop.synchronize()
            pending.popleft()
            most -= 1
            anchor, at_ns = self._anchors[dev]
            t0 = at_ns + int(cupy.cuda.get_elapsed_time(anchor, start) * 1e6)
            t1 = at_ns + int(cupy.cuda.get_elapsed_time(anchor, stop) * 1e6)
            self.ring.add(('X', name, cat, t0, t1, tid, args))
