"""Per-rank time per iteration by category, overlap of communication, and gradient bandwidth.

An iteration is one ``step`` event (``MultiNodeOptimizer.update``) together with the time since
the previous one ended (the ``data`` phase that fetched its batch).  Each instant of an iteration
counts once, in the first of these that covers it on that rank: ``compute`` (the main thread's
compute events), ``wait`` (inside an agreement check: waiting for the other ranks), ``comm``
(communication on any thread: the exposed part), ``io``, ``eval``, ``data``; what none covers is
``other``.  So the categories of an iteration add up to its length.
"""

import collections

from chainermn_tools.trace._intervals import union
from chainermn_tools.trace._stats import CATEGORIES, median, p95
from chainermn_tools.trace._straggler import find_stragglers

__all__ = ['CATEGORIES', 'RankStats', 'Report', 'analyse_rank', 'analyse', 'median', 'p95',
           'main_tid', 'windows_of']

#: One rank: ``windows`` [(start_us, end_us, iteration)], ``per_iter`` {category or 'iteration':
#: [ms per iteration]}, ``comm_ms`` / ``exposed_ms`` (whole run, wait excluded), ``hidden`` (share
#: of communication covered by compute, None without communication), ``bandwidth`` [GB/s per
#: gradient all-reduce event], ``main_tid``.
RankStats = collections.namedtuple('RankStats', ['rank', 'host', 'windows', 'per_iter', 'comm_ms',
                                                 'exposed_ms', 'hidden', 'bandwidth', 'main_tid'])

#: The whole report: ``ranks`` [RankStats], ``median_iteration_ms`` (all ranks' iterations),
#: ``stragglers`` [Straggler], ``best_bandwidth`` (GB/s, rank) or None, ``notes`` [str].
Report = collections.namedtuple('Report', ['trace', 'ranks', 'median_iteration_ms', 'stragglers',
                                           'best_bandwidth', 'notes'])


def main_tid(events, threads, rank):
    """Return the tid of ``rank``'s main thread: where its step events are, else the one named main."""
    tids = collections.Counter(e.get('tid') for e in events if e.get('cat') == 'step')
    if tids:
        return tids.most_common(1)[0][0]
    named = [tid for (pid, tid), name in threads.items() if pid == rank and name == 'main']
    return named[0] if named else 0


def _span(ev):
    return (float(ev['ts']), float(ev['ts']) + float(ev['dur']))


def windows_of(steps, data):
    """Return [(start, end, iteration)] from the step events and the main thread's data events.

    Iteration i runs from the end of update i-1 to the end of update i; the first one starts
    at the data event that ends where it begins (if any), so all iterations hold a data phase.
    """
    out, prev_end = [], None
    for i, ev in enumerate(sorted(steps, key=lambda e: e['ts'])):
        start, end = _span(ev)
        n = (ev.get('args') or {}).get('iteration', i)
        if prev_end is None:
            # Why 1 us: the two events are stamped by separate clock reads around the same instant.
            before = [a for a, b in data if abs(b - start) <= 1.0]
            lo = min(before + [start])
        else:
            lo = prev_end
        out.append((lo, end, n))
        prev_end = end
    return out


def _sets(events, tid):
    """Return the disjoint time sets per category (the precedence of the module docstring)."""
    by_cat = collections.defaultdict(list)
    for ev in events:
        cat = ev.get('cat')
        if cat == 'compute' and ev.get('tid') != tid:
            continue  # compute on other threads is not the main thread's critical path
        by_cat[cat].append(_span(ev))
    sets, covered = {}, union([])
    for cat in CATEGORIES[:-1]:
        raw = union(by_cat.get(cat, []))
        sets[cat] = raw - covered
        covered = covered | raw
    comm = union(by_cat.get('comm', []))
    return sets, comm - union(by_cat.get('wait', []))


def _bandwidth(events):
    """Return GB/s of each gradient all-reduce event: bytes / (its duration minus its wait)."""
    waits = collections.defaultdict(list)
    for ev in events:
        if ev.get('cat') == 'wait':
            waits[ev.get('tid')].append(_span(ev))
    waits = {tid: union(pairs) for tid, pairs in waits.items()}
    out = []
    for ev in events:
        args = ev.get('args') or {}
        if ev.get('cat') != 'comm' or not args.get('grad') or not args.get('bytes'):
            continue
        lo, hi = _span(ev)
        wait = waits[ev.get('tid')].measure(lo, hi) if ev.get('tid') in waits else 0.0
        if hi - lo - wait > 0:
            out.append(float(args['bytes']) / (hi - lo - wait) / 1e3)  # bytes/us -> GB/s
    return out


def analyse_rank(rank, host, events, threads):
    """Return the RankStats of one rank from its complete events (any order)."""
    tid = main_tid(events, threads, rank)
    steps = [e for e in events if e.get('cat') == 'step' and e.get('tid') == tid]
    data = [_span(e) for e in events if e.get('cat') == 'data' and e.get('tid') == tid]
    windows = windows_of(steps, data)
    sets, comm = _sets(events, tid)
    per_iter = {'iteration': [(hi - lo) / 1e3 for lo, hi, _ in windows]}
    for cat in CATEGORIES[:-1]:
        per_iter[cat] = [sets[cat].measure(lo, hi) / 1e3 for lo, hi, _ in windows]
    per_iter['other'] = [max(0.0, it - sum(per_iter[c][i] for c in CATEGORIES[:-1]))
                         for i, it in enumerate(per_iter['iteration'])]
    comm_ms = sum(comm.measure(lo, hi) for lo, hi, _ in windows) / 1e3
    exposed_ms = sum(per_iter['comm'])
    hidden = max(0.0, 1.0 - exposed_ms / comm_ms) if comm_ms > 0 else None  # rounding: never -0%
    return RankStats(rank, host, windows, per_iter, comm_ms, exposed_ms, hidden,
                     _bandwidth(events), tid)


def analyse(trace):
    """Return the Report of a loaded Trace (see chainermn_tools.trace._load)."""
    by_rank = collections.defaultdict(list)
    for ev in trace.events:
        by_rank[ev.get('pid')].append(ev)
    notes = []
    ranks = []
    for rank in sorted(r for r in by_rank if isinstance(r, int)):
        info = trace.ranks.get(rank, {})
        stats = analyse_rank(rank, info.get('host', '?'), by_rank[rank], trace.threads)
        if stats.windows:
            ranks.append(stats)
        else:
            notes.append('rank {} recorded no update (step) events'.format(rank))
    if not ranks:
        raise ValueError('{} holds no "step" events (one per MultiNodeOptimizer.update): the '
                         'report counts iterations by them; was the optimizer a multi-node '
                         'optimizer?'.format(trace.source))
    seen = {r.rank for r in ranks} | {r for r in by_rank if isinstance(r, int)}
    missing = [r for r in range(trace.size) if r not in seen]
    if missing:
        notes.append('no events from rank(s) {} of {} (their part files are missing)'.format(
            ', '.join(map(str, missing)), trace.size))
    for rank, info in sorted(trace.ranks.items()):
        if info.get('dropped'):
            notes.append('rank {} dropped its {} oldest events (ring of {}; raise '
                         'CHAINERMN_TRACE_EVENTS)'.format(rank, info['dropped'],
                                                           info.get('capacity') or '?'))
    median_iteration = median([v for r in ranks for v in r.per_iter['iteration']])
    best = max(((bw, r.rank) for r in ranks for bw in r.bandwidth), key=lambda t: (t[0], -t[1]),
               default=None)
    stragglers = find_stragglers(ranks, by_rank, median_iteration)
    return Report(trace, ranks, median_iteration, stragglers, best, notes)
