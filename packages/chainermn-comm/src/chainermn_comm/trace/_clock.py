"""Put every rank's events on rank 0's wall clock: one offset per rank, estimated once at start.

Events are stamped with ``time.perf_counter_ns`` (monotonic, fine-grained).  At start each rank
notes ``base = time.time_ns() - perf_counter_ns()``, so ``stamp + base`` is its wall clock.  Rank 0
then serves a few ping-pongs with every other rank over a duplicate of ``MPI.COMM_WORLD``: the
rank sends a ping at ``t1``, rank 0 answers with its wall clock ``t0``, the answer arrives at
``t2``; ``t0 - (t1 + t2) / 2`` is the offset of rank 0's clock against this rank's, off by at most
half the round trip ``t2 - t1``.  The round with the smallest round trip is kept.  An event's
common time is ``stamp + base + offset``.
"""

import time

__all__ = ['Clock', 'ROUNDS']

#: Ping-pongs per rank; the one with the shortest round trip is kept.
ROUNDS = 10
_TAG = 0x7A11


class Clock:
    """This rank's wall clock base and its offset against rank 0 (microseconds)."""

    def __init__(self):
        self.base_ns = time.time_ns() - time.perf_counter_ns()
        self.offset_us = 0.0
        self.rtt_us = 0.0
        self.estimated = False

    def wall_ns(self):
        """Return this rank's wall clock in nanoseconds (``perf_counter_ns`` plus the base)."""
        return time.perf_counter_ns() + self.base_ns

    def to_us(self, stamp_ns):
        """Return a recording-clock stamp as microseconds on rank 0's wall clock."""
        return (stamp_ns + self.base_ns) / 1000.0 + self.offset_us

    def estimate(self, comm, rounds=ROUNDS):
        """Estimate the offset against rank 0 of ``comm`` by ping-pong (collective over ``comm``)."""
        import numpy
        rank, size = comm.Get_rank(), comm.Get_size()
        buf = numpy.zeros(1, numpy.int64)
        if rank == 0:
            for peer in range(1, size):
                for _ in range(rounds):
                    comm.Recv(buf, source=peer, tag=_TAG)
                    buf[0] = self.wall_ns()
                    comm.Send(buf, dest=peer, tag=_TAG)
            self.offset_us, self.rtt_us = 0.0, 0.0
        else:
            best = None
            for _ in range(rounds):
                t1 = self.wall_ns()
                comm.Send(buf, dest=0, tag=_TAG)
                comm.Recv(buf, source=0, tag=_TAG)
                t2 = self.wall_ns()
                rtt = t2 - t1
                if best is None or rtt < best[0]:
                    best = (rtt, int(buf[0]) - (t1 + t2) / 2.0)
            self.rtt_us, self.offset_us = best[0] / 1000.0, best[1] / 1000.0
        self.estimated = True
