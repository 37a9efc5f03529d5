"""What communication hooks did in a traced run: their compute and their bytes, apart from the rest.

A gradient average through a hook (``comm_hook``) is a ``comm`` event whose args name the hook
(``"hook"``); inside it a hook may record its own compute (``compute`` events naming the hook,
e.g. PowerSGD's ``powersgd compress``) and its own all-reduces (``comm`` events with
``"hook_wire": true`` whose ``bytes`` are what crossed the wire).  Per hook and iteration: the
hook's compute, its all-reduces' time and bytes, against the gradient bytes it averaged.
"""

import collections

from chainermn_tools.trace._analyse import median

__all__ = ['HookStats', 'hook_stats', 'hook_lines']

#: One hook over all ranks' iterations (medians per iteration): ``compute_ms``, ``wire_ms``,
#: ``wire_bytes``, ``grad_bytes``, and ``parts`` {compute event name: median ms per iteration}.
HookStats = collections.namedtuple('HookStats', ['hook', 'iterations', 'compute_ms', 'wire_ms',
                                                 'wire_bytes', 'grad_bytes', 'parts'])


def _within(ev, lo, hi):
    ts = float(ev['ts'])
    return lo <= ts < hi


def hook_stats(report):
    """Return [HookStats] of every hook named by a gradient average of ``report`` (a Report)."""
    by_rank = collections.defaultdict(list)
    for ev in report.trace.events:
        if (ev.get('args') or {}).get('hook') is not None and ev.get('ph', 'X') == 'X':
            by_rank[ev.get('pid')].append(ev)
    samples = collections.defaultdict(lambda: collections.defaultdict(list))
    for stats in report.ranks:
        events = by_rank.get(stats.rank, [])
        for lo, hi, _ in stats.windows:
            per = collections.defaultdict(lambda: collections.Counter())
            for ev in events:
                if not _within(ev, lo, hi):
                    continue
                args, hook = ev['args'], ev['args']['hook']
                dur = float(ev.get('dur', 0.0)) / 1e3
                if ev.get('cat') == 'compute':
                    per[hook]['compute_ms'] += dur
                    per[hook]['part:' + ev.get('name', '?')] += dur
                elif ev.get('cat') == 'comm' and args.get('hook_wire'):
                    per[hook]['wire_ms'] += dur
                    per[hook]['wire_bytes'] += float(args.get('bytes', 0))
                elif ev.get('cat') == 'comm' and args.get('grad'):
                    per[hook]['grad_bytes'] += float(args.get('bytes', 0))
                    per[hook]['seen'] += 1
            for hook, counter in per.items():
                if counter['seen']:
                    for key in set(counter) | {'compute_ms', 'wire_ms', 'wire_bytes', 'grad_bytes'}:
                        samples[hook][key].append(counter[key])
    out = []
    for hook in sorted(samples):
        s = samples[hook]
        parts = {k[5:]: median(v) for k, v in sorted(s.items()) if k.startswith('part:')}
        out.append(HookStats(hook, len(s['seen']), median(s['compute_ms']), median(s['wire_ms']),
                             median(s['wire_bytes']), median(s['grad_bytes']), parts))
    return out


def _ms(value):
    """Return milliseconds as written in the report: 0.1 ms steps, 3 decimals below 1 ms (tiny models)."""
    return '{:.1f}'.format(value) if value >= 1 else '{:.3f}'.format(value)


def hook_lines(report):
    """Return one line per hook for the text report (none when no average used a hook)."""
    lines = []
    for h in hook_stats(report):
        text = 'comm hook {}: {} rank-iterations; gradient {:.3g} MB per iteration'.format(
            h.hook, h.iterations, h.grad_bytes / 1e6)
        if h.compute_ms or h.parts:
            text += '; hook compute {} ms ({})'.format(_ms(h.compute_ms), ', '.join(
                '{} {}'.format(k, _ms(v)) for k, v in h.parts.items()))
        if h.wire_bytes:
            text += '; its all-reduces {} ms, {:.3g} MB ({:.1%} of the gradient)'.format(
                _ms(h.wire_ms), h.wire_bytes / 1e6, h.wire_bytes / h.grad_bytes if h.grad_bytes else 0.0)
        lines.append(text + ' (medians per iteration over all ranks)')
    return lines
