"""Measure the links: MPI_Allreduce latency and bandwidth within a node and between nodes.

Within a node: the ranks that share a host name, every host at once.  Between nodes: one rank per
host (the lowest), after that.  Latency: the median time of many 8-byte all-reduces; bandwidth:
the algorithm bandwidth (bytes / time) of a few 64 MiB all-reduces.  Each call is timed after a
barrier and counts as long as its slowest rank took.  The raw mpi4py communicator is used, not
a chainermn communicator: this measures what MPI gets from the links.
"""

import time

import numpy

from chainermn_tools.doctor._report import FAIL, INFO, SKIP, Row, ranges

__all__ = ['LATENCY_BYTES', 'LATENCY_REPS', 'BANDWIDTH_BYTES', 'BANDWIDTH_REPS', 'measure',
           'rows_for']

LATENCY_BYTES = 8
LATENCY_REPS = 100
BANDWIDTH_BYTES = 64 * 2 ** 20
BANDWIDTH_REPS = 3
WITHIN, BETWEEN = 'link within a node', 'link between nodes'


def _allreduce_seconds(comm, MPI, nbytes, reps):
    """Return (median seconds per call over ``reps``, values correct on every rank). Collective."""
    send = numpy.ones(nbytes // 8, dtype=numpy.float64)
    recv = numpy.empty_like(send)
    comm.Allreduce(send, recv, op=MPI.SUM)  # warm-up: connections, buffers, page faults
    times = numpy.empty(reps)
    for i in range(reps):
        comm.Barrier()
        start = time.perf_counter()
        comm.Allreduce(send, recv, op=MPI.SUM)
        times[i] = time.perf_counter() - start
    ok = bool(numpy.all(recv == comm.Get_size()))
    slowest = numpy.empty_like(times)
    comm.Allreduce(times, slowest, op=MPI.MAX)
    return float(numpy.median(slowest)), comm.allreduce(ok, op=MPI.LAND)


def _measure_on(comm, MPI):
    latency, ok1 = _allreduce_seconds(comm, MPI, LATENCY_BYTES, LATENCY_REPS)
    seconds, ok2 = _allreduce_seconds(comm, MPI, BANDWIDTH_BYTES, BANDWIDTH_REPS)
    return {'ranks': comm.Get_size(), 'latency_us': latency * 1e6,
            'gbps': BANDWIDTH_BYTES / seconds / 1e9, 'ok': ok1 and ok2}


def measure(world, MPI, hosts):
    """Measure on every rank (``hosts``: each rank's host name); return the results on rank 0.

    Returns {'within': {host: result}, 'between': result or None, 'hosts': {host: [ranks]}},
    a result being {'ranks', 'latency_us', 'gbps', 'ok'}.  Collective over ``world``.
    """
    rank = world.Get_rank()
    by_host = {}
    for r, h in enumerate(hosts):
        by_host.setdefault(h, []).append(r)
    order = list(by_host)
    node = world.Split(order.index(hosts[rank]), rank)
    mine = _measure_on(node, MPI) if node.Get_size() > 1 else None
    node.Free()
    world.Barrier()  # the nodes are quiet before the link between them is measured
    leader = by_host[hosts[rank]][0] == rank
    heads = world.Split(0 if leader else MPI.UNDEFINED, rank)
    between = None
    if heads != MPI.COMM_NULL:
        if heads.Get_size() > 1:
            between = _measure_on(heads, MPI)
        heads.Free()
    found = world.gather((hosts[rank], mine if leader else None, between), root=0)
    if rank != 0:
        return None
    within = {h: m for h, m, _ in found if m is not None}
    return {'within': within, 'between': found[0][2], 'hosts': by_host}


def _figures(result):
    return 'latency {:.1f} us, bandwidth {:.2f} GB/s'.format(result['latency_us'], result['gbps'])


METHOD = ('MPI_Allreduce: {} bytes, median of {}; {} MiB, algorithm bandwidth (bytes / time), '
          'median of {}'.format(LATENCY_BYTES, LATENCY_REPS, BANDWIDTH_BYTES >> 20, BANDWIDTH_REPS))
WRONG = ('the all-reduce gave wrong values: check that every host uses the same MPI and network '
         'settings (try the manual\'s check_mpi4py.py)')


def rows_for(found, size):
    """Return the doctor's two link rows from ``measure``'s result on rank 0."""
    hosts = found['hosts']
    if size == 1:
        why = 'one rank: run under `mpiexec -n 2` (or more) to measure'
        return [Row(WITHIN, SKIP, why), Row(BETWEEN, SKIP, why)]
    rows = []
    within = found['within']
    if not within:
        rows.append(Row(WITHIN, SKIP, 'not measurable: every host runs one rank ({})'.format(
            ', '.join(hosts))))
    else:
        shown = sorted(within.items(), key=lambda kv: kv[1]['gbps'])
        if len(shown) > 3:  # many nodes: the slowest and the fastest say enough
            shown = [shown[0], shown[-1]]
        text = '; '.join('{} (ranks {}): {}'.format(h, ranges(hosts[h]), _figures(m))
                         for h, m in shown)
        if len(within) > len(shown):
            text = 'slowest and fastest of {} nodes: {}'.format(len(within), text)
        good = all(m['ok'] for m in within.values())
        rows.append(Row(WITHIN, INFO if good else FAIL, '{} ({})'.format(text, METHOD), WRONG))
    between = found['between']
    if len(hosts) == 1:
        rows.append(Row(BETWEEN, SKIP, 'not measurable: all {} ranks run on one host ({}); run '
                        'across 2 or more hosts to measure'.format(size, next(iter(hosts)))))
    elif between is None:
        rows.append(Row(BETWEEN, SKIP, 'not measured'))
    else:
        leaders = [rs[0] for rs in hosts.values()]
        rows.append(Row(BETWEEN, INFO if between['ok'] else FAIL,
                        '{} nodes, one rank each (ranks {}): {} ({})'.format(
                            len(hosts), ranges(leaders), _figures(between), METHOD), WRONG))
    return rows
