"""Name the ranks that arrive late at the gradient all-reduce, and where their extra time goes.

A rank's arrival at a collective is the start of its ``wait`` event (the agreement check) inside
the gradient all-reduce's ``comm`` event (``"grad": true``), else the start of that event; the
same collective on every rank has the same ``call`` number.  Its lateness is its arrival minus
the median arrival (the lower middle one for an even number of ranks, so that of two ranks the
slow one is late by the whole gap).  Per update, a rank's lateness is its largest one among that
update's gradient all-reduce calls (one per update, or one per bucket).  A straggler is late by
at least 20% of the median iteration at more than half of the updates it took part in.
"""

import bisect
import collections
import statistics

from chainermn_tools.trace._stats import CATEGORIES, median

__all__ = ['Straggler', 'THRESHOLD', 'find_stragglers', 'lateness']

#: Late by at least this share of the median iteration, at more than half of the updates.
THRESHOLD = 0.2

#: ``late_ms``: median lateness over the late updates; ``count`` of ``updates``; ``category`` where
#: its extra time per iteration is largest against the median of the other ranks (``extra_ms``).
Straggler = collections.namedtuple('Straggler', ['rank', 'host', 'late_ms', 'count', 'updates',
                                                 'category', 'extra_ms'])


def _arrivals(events, stats):
    """Return {(collective, call): (arrival_us, iteration)} of one rank's gradient all-reduces."""
    waits = collections.defaultdict(list)
    for ev in events:
        if ev.get('cat') == 'wait':
            waits[ev.get('tid')].append(ev)
    for tid in waits:
        waits[tid].sort(key=lambda e: e['ts'])
    wait_ts = {tid: [float(w['ts']) for w in ws] for tid, ws in waits.items()}
    starts = [lo for lo, _, _ in stats.windows]
    seen = collections.Counter()
    out = {}
    for ev in sorted(events, key=lambda e: e['ts']):
        args = ev.get('args') or {}
        if ev.get('cat') != 'comm' or not args.get('grad'):
            continue
        lo, hi = float(ev['ts']), float(ev['ts']) + float(ev['dur'])
        ts = wait_ts.get(ev.get('tid'), [])
        j = bisect.bisect_left(ts, lo)
        wait = waits[ev.get('tid')][j] if j < len(ts) and ts[j] <= hi else None
        arrival = float(wait['ts']) if wait else lo
        wargs = (wait.get('args') or {}) if wait else {}
        name = wargs.get('collective', ev.get('name'))
        call = wargs.get('call', args.get('call'))
        if call is None:  # no call numbers: match the calls of each name by their order
            call = 'n{}'.format(seen[name])
            seen[name] += 1
        i = bisect.bisect_right(starts, arrival) - 1
        if i >= 0:
            out[(name, call)] = (arrival, stats.windows[i][2])
    return out


def lateness(ranks, by_rank):
    """Return {rank: {update: lateness_ms}} over the gradient all-reduce calls seen by 2+ ranks."""
    arrivals = {s.rank: _arrivals(by_rank[s.rank], s) for s in ranks}
    calls = collections.defaultdict(dict)
    for rank, seen in arrivals.items():
        for key, value in seen.items():
            calls[key][rank] = value
    out = collections.defaultdict(dict)
    for key, per_rank in calls.items():
        if len(per_rank) < 2:
            continue
        mid = statistics.median_low([a for a, _ in per_rank.values()])
        update = per_rank[min(per_rank)][1]  # the update of the lowest rank that made the call
        for rank, (arrival, _) in per_rank.items():
            late = (arrival - mid) / 1e3
            out[rank][update] = max(late, out[rank].get(update, late))
    return out


def _extra(stats, others):
    """Return (category, ms per iteration) where ``stats`` spends most above the other ranks."""
    best = ('other', 0.0)
    for cat in CATEGORIES:
        if cat == 'wait':
            continue  # a straggler waits less; the others' wait is its doing, not theirs
        mine = median(stats.per_iter[cat])
        typical = statistics.median(median(o.per_iter[cat]) for o in others)
        if mine - typical > best[1]:
            best = (cat, mine - typical)
    return best


def find_stragglers(ranks, by_rank, median_iteration_ms, threshold=THRESHOLD):
    """Return the Stragglers among the RankStats ``ranks`` (``by_rank``: {rank: events})."""
    if len(ranks) < 2:
        return []
    limit = threshold * median_iteration_ms
    flagged = []
    for rank, updates in sorted(lateness(ranks, by_rank).items()):
        late = [v for v in updates.values() if v >= limit]
        if updates and len(late) * 2 > len(updates):
            flagged.append((rank, median(late), len(late), len(updates)))
    named = {r for r, _, _, _ in flagged}
    others = [s for s in ranks if s.rank not in named] or ranks
    out = []
    for rank, late_ms, count, total in flagged:
        stats = next(s for s in ranks if s.rank == rank)
        category, extra = _extra(stats, others)
        out.append(Straggler(rank, stats.host, late_ms, count, total, category, extra))
    return out
