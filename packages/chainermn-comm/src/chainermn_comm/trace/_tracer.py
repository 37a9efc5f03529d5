"""One process's trace: where it goes, its ring, its clock, and how it is written out."""

import os
import sys
import threading
import time

from chainermn_comm.trace import _export
from chainermn_comm.trace._clock import Clock
from chainermn_comm.trace._device import DeviceTimer
from chainermn_comm.trace._ring import Ring

__all__ = ['Tracer']


class Tracer:
    """The trace of this process: rank ``rank`` of ``size`` in ``MPI.COMM_WORLD``, into ``directory``."""

    def __init__(self, directory, capacity, rank, size, host):
        self.directory = os.path.abspath(directory)
        self.rank = rank
        self.size = size
        self.host = host
        self.ring = Ring(capacity)
        self.clock = Clock()
        self.device = DeviceTimer(self.ring)
        #: Names the job's parts (the same on every rank once the clock is estimated).
        self.run = None
        #: Why the part was first written ('exit', 'exception', 'sigterm', 'watchdog', ...).
        self.reason = None
        self._flush_lock = threading.RLock()

    def start_clock(self, world):
        """Estimate the clock offset against rank 0 and agree on the run's name (collective)."""
        comm = world.Dup()
        try:
            self.clock.estimate(comm)
            self.run = comm.bcast('{}-{}'.format(time.time_ns(), os.getpid()) if self.rank == 0
                                  else None, root=0)
        finally:
            comm.Free()

    # -- writing ----------------------------------------------------------------------------
    def part_document(self):
        """Return this rank's part: metadata, then its events on the common clock."""
        try:
            self.device.drain()
        except Exception:  # the GPU may be gone at exit; keep what the host recorded
            pass
        raw, dropped = self.ring.snapshot()
        pid, to_us = self.rank, self.clock.to_us
        events = [
            {'name': 'process_name', 'ph': 'M', 'pid': pid, 'tid': 0,
             'args': {'name': 'rank {} ({})'.format(self.rank, self.host)}},
            {'name': 'process_sort_index', 'ph': 'M', 'pid': pid, 'tid': 0,
             'args': {'sort_index': self.rank}}]
        for tid, name in sorted(self.ring.names.items()):
            events.append({'name': 'thread_name', 'ph': 'M', 'pid': pid, 'tid': tid,
                           'args': {'name': name}})
        for ph, name, cat, t0, t1, tid, args in raw:
            e = {'name': name, 'cat': cat, 'ph': ph, 'ts': round(to_us(t0), 3), 'pid': pid,
                 'tid': tid, 'args': args or {}}
            if ph == 'X':
                e['dur'] = round(max(0, t1 - t0) / 1000.0, 3)
            else:
                e['s'] = 'p'
            events.append(e)
        clock = self.clock
        return {'chainermn_trace': _export.FORMAT_VERSION, 'rank': self.rank, 'size': self.size,
                'host': self.host, 'pid': os.getpid(),
                'clock': {'offset_us': clock.offset_us, 'rtt_us': clock.rtt_us,
                          'reference_rank': 0, 'estimated': clock.estimated},
                'capacity': self.ring.capacity, 'dropped': dropped, 'reason': self.reason,
                'run': self.run, 'traceEvents': events}

    def flush(self, reason):
        """Write this rank's part and merge; the first reason given is the one kept.

        On a normal exit the merge waits for every rank's part (the last rank to finish merges);
        on any other reason (an exception, SIGTERM, the watchdog) the parts present are merged
        now, since the other ranks may never write theirs.  Returns the merged file or None.
        """
        if not self._flush_lock.acquire(timeout=30):
            return None
        try:
            if self.reason is None:
                self.reason = reason
            if self.reason == 'exit' and getattr(sys, 'last_value', None) is not None:
                self.reason = 'exception'  # an uncaught exception ended the program
            # The directory was made and checked at start (``communicator_created``).
            _export.write_part(self.directory, self.part_document())
            return _export.merge(self.directory, run=self.run, require_all=reason == 'exit')
        finally:
            self._flush_lock.release()
