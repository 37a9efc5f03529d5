"""The per-rank event ring: a bounded deque of raw events, and the threads' tracks."""

import collections
import threading
import weakref

__all__ = ['Ring']


class Ring:
    """Keep the newest ``capacity`` events of this process; count the ones dropped.

    An event is a tuple ``(ph, name, cat, start_ns, end_ns, tid, args)`` on the recording clock
    (``time.perf_counter_ns``); ``ph`` is ``'X'`` (complete) or ``'i'`` (instant).  Threads get
    small track numbers on first use: 0 is the main thread ("main").
    """

    def __init__(self, capacity):
        self.capacity = int(capacity)
        self.events = collections.deque(maxlen=self.capacity)
        self.dropped = 0
        #: tid -> track name, in the order tracks were made.
        self.names = {0: 'main'}
        main = threading.main_thread()
        self._tids = {main.ident: 0}
        self._owners = {0: weakref.ref(main)}  # tid -> the thread that records on it
        # Taken per event: an uncontended lock costs ~0.1 us and keeps ``dropped`` exact when
        # the main and the overlap thread record at once.
        self._lock = threading.Lock()

    def add(self, event):
        """Append ``event``; when the ring is full the oldest event goes and is counted."""
        with self._lock:
            if len(self.events) == self.capacity:
                self.dropped += 1
            self.events.append(event)

    def tid(self):
        """Return the calling thread's track number (a new one on first use)."""
        me = threading.current_thread()
        tid = self._tids.get(me.ident)
        # Thread ids are reused once a thread ends: check that the track is this thread's.
        if tid is None or self._owners[tid]() is not me:
            with self._lock:
                tid = self._new_track(me, me.name)
        return tid

    def _new_track(self, thread, name, reuse=False):
        """Give ``thread`` a track named ``name``: with ``reuse``, one of that name left by an
        ended thread (a thread started per iteration keeps one track)."""
        tid = None
        if reuse:
            for known, known_name in self.names.items():
                owner = self._owners.get(known)
                if known_name == name and (owner is None or owner() is None
                                           or not owner().is_alive()):
                    tid = known
                    break
        if tid is None:
            tid = len(self.names)
        self.names[tid] = name
        self._tids[thread.ident] = tid
        self._owners[tid] = weakref.ref(thread)
        return tid

    def name_thread(self, name):
        """Name the calling thread's track ``name`` (taking over the track of an ended thread
        of that name, so that e.g. every iteration's overlap thread lands on one track)."""
        me = threading.current_thread()
        with self._lock:
            self._new_track(me, str(name), reuse=True)

    def track(self, name):
        """Return the number of a track called ``name`` that no thread owns (made on first use).

        For work that runs on no host thread: e.g. buckets averaged on a side CUDA stream.
        """
        with self._lock:
            for tid, known in self.names.items():
                if known == name and tid not in self._owners:
                    return tid
            tid = len(self.names)
            self.names[tid] = name
            return tid

    def snapshot(self):
        """Return (a list of the events, the number dropped), consistent with each other.

        Also called from a signal handler, which may interrupt :meth:`add` on the same thread:
        after a short wait for the lock it copies without it (``list`` of a deque is one C call).
        """
        locked = self._lock.acquire(timeout=0.5)
        try:
            return list(self.events), self.dropped
        finally:
            if locked:
                self._lock.release()
