"""``DIR/trace.png``: a timeline of a few iterations per rank and thread, and the breakdown per rank.

Drawn with matplotlib's object API on an Agg canvas (no pyplot, so no global backend is chosen
for the caller).  matplotlib is optional: ``pip install "chainermn-tools[plot]"``.
"""

from chainermn_comm import safe_files

from chainermn_tools.trace._stats import median

__all__ = ['COLORS', 'PlotUnavailable', 'write_png']

#: Category colours (colour-blind-safe Okabe-Ito palette); 'step' marks the updates.
COLORS = {'compute': '#0072B2', 'comm': '#E69F00', 'wait': '#D55E00', 'data': '#009E73',
          'io': '#CC79A7', 'eval': '#56B4E9', 'other': '#BBBBBB', 'step': '#444444'}
#: Bar order bottom-up, and the timeline's drawing order (later categories on top).
BREAKDOWN = ('compute', 'comm', 'wait', 'data', 'io', 'eval', 'other')
DRAW = ('data', 'io', 'eval', 'comm', 'wait', 'compute')


class PlotUnavailable(Exception):
    """matplotlib is not installed; the message says how to get it."""


def _matplotlib():
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.patches import Patch
    except ImportError as e:
        raise PlotUnavailable('matplotlib is not installed ({}): `pip install "chainermn[plot]"` '
                              '(or "chainermn-tools[plot]", or matplotlib itself) to get '
                              'trace.png'.format(e)) from None
    return Figure, FigureCanvasAgg, Patch


def _span(report, iterations):
    """Return (start_us, end_us) of ``iterations`` consecutive iterations from the middle of the run."""
    windows = min((s.windows for s in report.ranks), key=len)
    k = max(1, min(iterations, len(windows)))
    first = max(0, (len(windows) - k) // 2)
    lo = min(s.windows[first][0] for s in report.ranks if len(s.windows) > first)
    hi = max(s.windows[min(first + k, len(s.windows)) - 1][1] for s in report.ranks)
    return lo, hi, windows[first][2], windows[first + k - 1][2]


def _rows(report, lo, hi):
    """Return [(label, rank, tid, {cat: [(start_ms, length_ms)]})] for the events in [lo, hi)."""
    trace = report.trace
    per_thread = {}
    for ev in trace.events:
        start, end = float(ev['ts']), float(ev['ts']) + float(ev['dur'])
        if end <= lo or start >= hi or ev.get('cat') not in COLORS:
            continue
        key = (ev.get('pid'), ev.get('tid'))
        per_thread.setdefault(key, {}).setdefault(ev['cat'], []).append(
            ((max(start, lo) - lo) / 1e3, (min(end, hi) - max(start, lo)) / 1e3))
    mains = {s.rank: s.main_tid for s in report.ranks}
    rows = []
    for (rank, tid) in sorted(per_thread, key=lambda k: (k[0], k[1] != mains.get(k[0]), k[1])):
        name = trace.threads.get((rank, tid)) or ('main' if tid == mains.get(rank) else
                                                  'thread {}'.format(tid))
        host = trace.ranks.get(rank, {}).get('host', '?')
        rows.append(('rank {} ({}) {}'.format(rank, host, name), rank, tid, per_thread[(rank, tid)]))
    return rows


def _timeline(ax, report, iterations, stragglers):
    lo, hi, first, last = _span(report, iterations)
    rows = _rows(report, lo, hi)
    for y, (_, _, _, cats) in enumerate(rows):
        for cat in DRAW:
            if cat in cats:
                ax.broken_barh(cats[cat], (y - 0.35, 0.7), facecolors=COLORS[cat], linewidth=0)
        if 'step' in cats:  # the update as a dark bar above the row: iteration boundaries
            ax.broken_barh(cats['step'], (y - 0.47, 0.1), facecolors=COLORS['step'], linewidth=0)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([r[0] for r in rows])
    for label, (_, rank, _, _) in zip(ax.get_yticklabels(), rows):
        if rank in stragglers:
            label.set_color(COLORS['wait'])
            label.set_fontweight('bold')
    ax.set_ylim(len(rows) - 0.5, -0.6)
    ax.set_xlim(0, (hi - lo) / 1e3)
    ax.set_xlabel('ms since the start of iteration {}'.format(first))
    title = 'iterations {}-{}'.format(first, last) if first != last else 'iteration {}'.format(first)
    if stragglers:
        title += ' (straggler: rank {})'.format(', '.join(map(str, sorted(stragglers))))
    ax.set_title(title, loc='left')
    ax.grid(axis='x', color='#DDDDDD', linewidth=0.6)
    ax.set_axisbelow(True)


def _breakdown(ax, report, stragglers):
    ranks = report.ranks
    x = list(range(len(ranks)))
    bottom = [0.0] * len(ranks)
    for cat in BREAKDOWN:
        values = [median(s.per_iter[cat]) for s in ranks]
        ax.bar(x, values, bottom=bottom, color=COLORS[cat], width=0.7, label=cat)
        bottom = [b + v for b, v in zip(bottom, values)]
    ax.set_xticks(x)
    ax.set_xticklabels(['{}\n{}'.format(s.rank, s.host) for s in ranks])
    for label, s in zip(ax.get_xticklabels(), ranks):
        if s.rank in stragglers:
            label.set_color(COLORS['wait'])
            label.set_fontweight('bold')
    ax.set_xlim(-0.6, len(ranks) - 0.4)
    ax.set_ylabel('ms per iteration (median)')
    ax.set_xlabel('rank')
    ax.set_title('median time per iteration, by category', loc='left')
    ax.grid(axis='y', color='#DDDDDD', linewidth=0.6)
    ax.set_axisbelow(True)


def write_png(report, path, iterations=3):
    """Draw the report's timeline and breakdown into the PNG ``path``; return ``path``."""
    Figure, FigureCanvasAgg, Patch = _matplotlib()
    stragglers = {s.rank for s in report.stragglers}
    n_rows = len(_rows(report, *_span(report, iterations)[:2]))
    top = min(0.38 * n_rows + 1.4, 24.0)
    width = max(11.0, min(24.0, 8.0 + 0.5 * len(report.ranks)))
    fig = Figure(figsize=(width, top + 4.4), dpi=100, layout='constrained')
    FigureCanvasAgg(fig)
    grid = fig.add_gridspec(2, 1, height_ratios=[top, 3.2])
    _timeline(fig.add_subplot(grid[0]), report, iterations, stragglers)
    _breakdown(fig.add_subplot(grid[1]), report, stragglers)
    handles = [Patch(color=COLORS[c], label=c) for c in BREAKDOWN]
    handles.append(Patch(color=COLORS['step'], label='update (step)'))
    fig.legend(handles=handles, loc='outside lower center', ncol=len(handles), frameon=False)
    fig.suptitle('chainermn trace: {} rank(s), median iteration {:.1f} ms'.format(
        len(report.ranks), report.median_iteration_ms), fontsize=12)
    with safe_files.atomic_write(path) as f:   # never through a name someone planted
        fig.savefig(f, format='png')
    return path
