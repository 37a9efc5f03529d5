"""Synthetic traces in the recorder's format (docs/trace.md), for the report's tests.

``make(...)`` lays out every rank's iterations on one clock: a ``data`` phase (with ``io`` /
``eval`` inside it when asked), then an ``update`` step holding ``forward``, ``backward``, the
gradient all-reduce and ``optimizer``.  Every rank arrives at the all-reduce when its own work is
done, waits (a ``wait`` event at the start of the ``comm`` event) until the last rank arrives,
and all leave together after the transfer; so a slowed rank makes the others wait.  With
``buckets`` the all-reduce runs as that many bucket events on an ``overlap`` thread, started as
backward produces them.  Any time may be a number (ms) or a function ``(rank, iteration) -> ms``.
"""

import json
import os

__all__ = ['make', 'write_parts', 'write_merged', 'T0_US']

T0_US = 1.7e15  # a time.time()-based clock in microseconds, as the recorder writes


def _ms(value, rank, i):
    return float(value(rank, i) if callable(value) else value)


class _Rank:
    def __init__(self, rank):
        self.rank = rank
        self.events = []

    def x(self, name, cat, start_ms, end_ms, tid=0, **args):
        ev = {'name': name, 'cat': cat, 'ph': 'X', 'pid': self.rank, 'tid': tid,
              'ts': T0_US + start_ms * 1e3, 'dur': (end_ms - start_ms) * 1e3}
        if args:
            ev['args'] = args
        self.events.append(ev)


def make(ranks=3, iterations=20, hosts=None, data=5.0, forward=10.0, backward=20.0, optimizer=2.0,
         transfer=4.0, grad_bytes=4 * 2 ** 20, slow_rank=None, slow=0.0, slow_in='data', gap=0.0,
         io=None, evaluate=None, buckets=None, dropped=0):
    """Return {rank: part document} of a synthetic run (see the module docstring).

    ``slow`` ms are added to ``slow_in`` ('data', 'forward', 'backward' or 'io') of ``slow_rank``;
    ``gap`` ms of unrecorded work sit between backward and the all-reduce; ``io`` / ``evaluate``:
    ms of a checkpoint / evaluation inside the data phase (a number or a function).
    """
    hosts = hosts or ['node0'] * ranks
    recs = [_Rank(r) for r in range(ranks)]
    t = [0.0] * ranks  # where each rank's next iteration starts
    call = 0
    for i in range(iterations):
        def cost(what, r):
            base = {'data': data, 'forward': forward, 'backward': backward, 'io': io or 0.0}[what]
            extra = slow if (r == slow_rank and slow_in == what) else 0.0
            return _ms(base, r, i) + extra

        starts, grad_ready = [], []
        for rec in recs:
            r = rec.rank
            io_ms, ev_ms = cost('io', r), _ms(evaluate or 0.0, r, i)
            d_end = t[r] + cost('data', r) + io_ms + ev_ms
            rec.x('data', 'data', t[r], d_end)
            if io_ms:
                rec.x('checkpoint save', 'io', t[r], t[r] + io_ms)
            if ev_ms:
                rec.x('evaluate', 'eval', t[r] + io_ms, t[r] + io_ms + ev_ms)
            f_end = d_end + cost('forward', r)
            b_end = f_end + cost('backward', r)
            rec.x('forward', 'compute', d_end, f_end)
            rec.x('backward', 'compute', f_end, b_end)
            starts.append(d_end)
            if buckets:
                step = (b_end - f_end) / buckets
                grad_ready.append([f_end + step * (k + 1) for k in range(buckets)])
            else:
                grad_ready.append([b_end + gap])
        n_calls = len(grad_ready[0])
        free = [0.0] * ranks  # when each rank's all-reduce thread is free again
        for k in range(n_calls):
            arrive = [max(grad_ready[r][k], free[r]) for r in range(ranks)]
            leave = max(arrive) + _ms(transfer, 0, i) / n_calls
            call += 1
            for rec in recs:
                r = rec.rank
                tid = 1 if buckets else 0
                name = 'bucket {}'.format(k) if buckets else 'multi_node_mean_grad'
                rec.x(name, 'comm', arrive[r], leave, tid=tid, bytes=grad_bytes // n_calls,
                      dtype='float32', op='mean', call=call, grad=True)
                rec.x('wait', 'wait', arrive[r], max(arrive), tid=tid, call=call,
                      collective=name)
                free[r] = leave
        done = max(max(free), max(g[-1] for g in grad_ready))
        for rec in recs:
            b_end = grad_ready[rec.rank][-1] - (0.0 if buckets else gap)
            o_start = max(done, b_end)
            o_end = o_start + _ms(optimizer, rec.rank, i)
            rec.x('optimizer', 'compute', o_start, o_end)
            rec.x('update', 'step', starts[rec.rank], o_end, iteration=i + 1)
            t[rec.rank] = o_end
    parts = {}
    for rec in recs:
        meta = [{'name': 'process_name', 'ph': 'M', 'pid': rec.rank, 'tid': 0,
                 'args': {'name': 'rank {} ({})'.format(rec.rank, hosts[rec.rank])}},
                {'name': 'process_sort_index', 'ph': 'M', 'pid': rec.rank, 'tid': 0,
                 'args': {'sort_index': rec.rank}},
                {'name': 'thread_name', 'ph': 'M', 'pid': rec.rank, 'tid': 0, 'args': {'name': 'main'}}]
        if buckets:
            meta.append({'name': 'thread_name', 'ph': 'M', 'pid': rec.rank, 'tid': 1,
                         'args': {'name': 'overlap'}})
        tune = {'name': 'tune', 'cat': 'tune', 'ph': 'i', 's': 'p', 'pid': rec.rank, 'tid': 0,
                'ts': T0_US, 'args': {'bucket_bytes': 1}}
        parts[rec.rank] = {
            'chainermn_trace': 1, 'rank': rec.rank, 'size': ranks, 'host': hosts[rec.rank],
            'pid': 1000 + rec.rank, 'clock': {'offset_us': 0.0, 'rtt_us': 20.0, 'reference_rank': 0},
            'capacity': 200000, 'dropped': dropped if rec.rank == 0 else 0, 'reason': 'exit',
            'traceEvents': meta + [tune] + sorted(rec.events, key=lambda e: e['ts'])}
    return parts


def write_parts(directory, parts):
    """Write ``DIR/trace.rank<R>.json`` for each part; return their paths."""
    paths = []
    for rank, doc in parts.items():
        path = os.path.join(str(directory), 'trace.rank{}.json'.format(rank))
        with open(path, 'w') as f:
            json.dump(doc, f)
        paths.append(path)
    return paths


def write_merged(directory, parts):
    """Write ``DIR/trace.json`` as the recorder's merge would; return its path."""
    meta, events, ranks = [], [], {}
    for rank, doc in sorted(parts.items()):
        for ev in doc['traceEvents']:
            (meta if ev['ph'] == 'M' else events).append(ev)
        ranks[str(rank)] = {'host': doc['host'], 'clock_offset_us': doc['clock']['offset_us'],
                            'clock_rtt_us': doc['clock']['rtt_us'], 'dropped': doc['dropped'],
                            'capacity': doc['capacity'], 'reason': doc['reason']}
    size = next(iter(parts.values()))['size']
    out = {'traceEvents': meta + sorted(events, key=lambda e: e['ts']), 'displayTimeUnit': 'ms',
           'otherData': {'chainermn_trace': 1, 'size': size, 'ranks': ranks}}
    path = os.path.join(str(directory), 'trace.json')
    with open(path, 'w') as f:
        json.dump(out, f)
    return path
