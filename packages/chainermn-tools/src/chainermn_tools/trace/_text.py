"""The report as text: one aligned table of per-iteration times per rank, then one line per finding."""

import math
import textwrap

from chainermn_tools.trace._stats import median, p95
from chainermn_tools.trace._hooks import hook_lines
from chainermn_tools.trace._straggler import THRESHOLD

__all__ = ['COLUMNS', 'render', 'straggler_line']

#: Per-iteration columns of the table (keys of RankStats.per_iter) and their headings.
COLUMNS = (('iteration', 'iter'), ('compute', 'compute'), ('comm', 'comm'), ('wait', 'wait'),
           ('data', 'data'), ('io', 'io'), ('eval', 'eval'), ('other', 'other'))


LEGEND = ('Each instant of an iteration counts once, in the first of compute, wait, comm, io, eval, '
          'data that covers it. comm: communication not hidden behind the main thread\'s compute, '
          'waiting excluded; wait: for the other ranks to arrive; data: between updates; other: in '
          'no recorded event; hidden: share of communication (waiting excluded) behind compute; '
          'grad GB/s: gradient all-reduce bytes / (duration - wait), median and best.')


def _ms(value):
    return '-' if math.isnan(value) else '{:.1f}'.format(value)


def _table(report):
    head = ['rank', 'host', ''] + [h for _, h in COLUMNS] + ['hidden', 'grad GB/s', 'best']
    rows = []
    for s in report.ranks:
        hidden = '-' if s.hidden is None else '{:.0f}%'.format(100 * s.hidden)
        bw = ('{:.2f}'.format(median(s.bandwidth)), '{:.2f}'.format(max(s.bandwidth))) \
            if s.bandwidth else ('-', '-')
        rows.append([str(s.rank), s.host, 'median'] + [_ms(median(s.per_iter[k])) for k, _ in COLUMNS]
                    + [hidden, bw[0], bw[1]])
        rows.append(['', '', 'p95'] + [_ms(p95(s.per_iter[k])) for k, _ in COLUMNS] + ['', '', ''])
    widths = [max(len(r[i]) for r in [head] + rows) for i in range(len(head))]
    left = 3  # rank, host and the statistic are text: left-aligned; the figures right-aligned

    def line(cells):
        return '  '.join(c.ljust(w) if i < left else c.rjust(w)
                         for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    return [line(head), line(['-' * w for w in widths])] + [line(r) for r in rows]


def straggler_line(s):
    """Return the one-line finding for a Straggler."""
    return ('straggler: rank {} ({}) arrives {:.1f} ms after the median at {} of {} updates; its '
            'extra time is in {} (+{:.1f} ms per iteration against the median rank)'.format(
                s.rank, s.host, s.late_ms, s.count, s.updates, s.category, s.extra_ms))


def _bandwidth_line(report):
    if report.best_bandwidth is None:
        return 'gradient all-reduce: no events with "grad": true and a byte count'
    values = [bw for s in report.ranks for bw in s.bandwidth]
    best, rank = report.best_bandwidth
    mid = median(values)
    return ('gradient all-reduce: median {:.2f} GB/s over {} calls, best seen {:.2f} GB/s (rank {}); '
            'the median reaches {:.0f}% of the best'.format(mid, len(values), best, rank,
                                                            100 * mid / best))


def _straggler_lines(report):
    if report.stragglers:
        return [straggler_line(s) for s in report.stragglers]
    if len(report.ranks) < 2:
        return ['stragglers: not measurable with one rank']
    if report.best_bandwidth is None and not any(
            (e.get('args') or {}).get('grad') for e in report.trace.events):
        return ['stragglers: no gradient all-reduce events to compare arrivals at']
    return ['stragglers: none (no rank arrives at the gradient all-reduce {:.1f} ms, {:.0f}% of '
            'the median iteration, after the median at more than half of the updates)'.format(
                THRESHOLD * report.median_iteration_ms, 100 * THRESHOLD)]


def render(report):
    """Return the whole text report (no trailing newline)."""
    ranks = report.ranks
    hosts = sorted({s.host for s in ranks})
    counts = sorted({len(s.windows) for s in ranks})
    updates = str(counts[0]) if len(counts) == 1 else '{}-{}'.format(counts[0], counts[-1])
    out = ['chainermn trace: {}'.format(report.trace.source),
           '{} rank(s) on {} host(s), {} updates per rank, median iteration {:.1f} ms'.format(
               len(ranks), len(hosts), updates, report.median_iteration_ms),
           '',
           'per iteration, ms (median, then 95th percentile)',
           '']
    out += _table(report)
    out += [''] + textwrap.wrap(LEGEND, 100) + ['']
    out.append(_bandwidth_line(report))
    out += hook_lines(report)
    out += _straggler_lines(report)
    out += ['note: ' + n for n in report.notes]
    return '\n'.join(out)
