"""Measure the machine state the all-reduce figures depend on: how fast a core reads lines another core just wrote.

On the 2-vCPU test VM the host sometimes places the two vCPUs so that reading cache lines
that the other vCPU has just written costs 2-3x a local read ("slow cross-core" state).  The
node-shared-memory average moves every byte between cores that way, so its ratio to the
MPI floor depends on this state; each benchmark run records it before and after.

It opens its own small shared window instead of ``chainermn_comm.reduce.node_shared._Shared``: the
peer job runs it too, and that job must not import our packages.
"""

import time

import numpy
from mpi4py import MPI

__all__ = ['cross_core_read', 'PROBE_BYTES']

PROBE_BYTES = 512 * 1024
_ROUNDS = 40


def cross_core_read(comm):
    """Return {'hot_us', 'local_us', 'ratio'}: median time to read PROBE_BYTES a peer just wrote vs. own.

    Collective over ``comm``.  Ranks pair up within their shared-memory node (local rank r
    reads from local rank r^1); returns None on every rank when no node has two ranks.
    """
    node = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())
    try:
        if not comm.allreduce(node.Get_size() >= 2, op=MPI.LAND):
            return None
        rank, size = node.Get_rank(), node.Get_size()
        n = PROBE_BYTES // 4
        win = MPI.Win.Allocate_shared(PROBE_BYTES, 4, comm=node)
        try:
            mine = numpy.frombuffer(win.Shared_query(rank)[0], numpy.float32, count=n)
            peer_rank = rank ^ 1 if (rank ^ 1) < size else rank
            peer = numpy.frombuffer(win.Shared_query(peer_rank)[0], numpy.float32, count=n)
            own = numpy.zeros(n, numpy.float32)
            fresh = numpy.zeros(n, numpy.float32)  # written by this rank just before the read
            out = numpy.empty(n, numpy.float32)
            win.Lock_all()

            def sync():
                win.Sync()
                node.Barrier()
                win.Sync()

            mine[:] = 0
            sync()
            float(peer.sum())  # map the peer's pages before timing
            hot, local = [], []
            for it in range(_ROUNDS):
                mine[:] = it
                sync()
                t0 = time.perf_counter()
                numpy.add(peer, own, out=out)
                hot.append(time.perf_counter() - t0)
                sync()
                fresh[:] = it
                t0 = time.perf_counter()
                numpy.add(fresh, own, out=out)
                local.append(time.perf_counter() - t0)
                sync()
            win.Unlock_all()
        finally:
            win.Free()
    finally:
        node.Free()
    h = comm.allreduce(float(numpy.median(hot)), op=MPI.MAX) * 1e6
    loc = comm.allreduce(float(numpy.median(local)), op=MPI.MAX) * 1e6
    return {'hot_us': h, 'local_us': loc, 'ratio': h / loc if loc else None,
            'bytes': PROBE_BYTES}
