"""Communication hooks across nodes joined by links of a set rate: the issue-45 targets.

Usage (as root, from the repo root):
    .venv/bin/python bench/hooks_cluster.py [--layouts 2x1,2x2] [--links 1,none] [--rounds R]
        [--calls K] [--iter-links 1] [--iters N] [--batch B] [--image PIXELS] [--size full|tiny]
        [--no-average] [--out-dir DIR]

For every link rate a cluster of namespaces is built (``chainermn.cluster.Cluster``); on it, for
every layout, ``bench/hooks_bench.py --part average`` times the ResNet-50 gradient average with
float32, float16, bfloat16, PowerSGD rank 4, ``Auto()`` and ``Auto(powersgd=PowerSGD(rank=4))``
(compute included, rounds interleaved), and at the ``--iter-links`` rates ``--part iteration``
times whole ResNet-50 iterations (float32, bfloat16, PowerSGD rank 4, compute only).  Prints the
table and the targets, writes ``hooks_cluster.json`` and ``hooks_cluster.png`` into ``--out-dir``.
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

from cluster import _link_name, _parse_layouts, _parse_links, link_bound  # noqa: E402

FIXED = ('float32', 'float16', 'bfloat16', 'powersgd_r4')


def _job(cluster, argv, k, timeout, what):
    env = {'OPENBLAS_NUM_THREADS': '1', 'OMP_NUM_THREADS': '1', 'MKL_NUM_THREADS': '1',
           'PYTHONUNBUFFERED': '1'}
    t0 = time.monotonic()
    res = cluster.mpiexec(argv, ranks_per_node=k, timeout=timeout, env=env, cwd=ROOT)
    if res.returncode != 0:
        raise SystemExit('bench/hooks_cluster.py: {} failed with status {}{}\n{}\n{}'.format(
            what, res.returncode, ' (timed out)' if res.timed_out else '', res.stdout[-4000:],
            res.stderr[-4000:]))
    print('[hooks] {} done in {:.0f}s'.format(what, time.monotonic() - t0), file=sys.stderr, flush=True)


def _row(avg, nodes, k, gbit):
    bound = link_bound(avg['bytes'], nodes, gbit)
    c = avg['contenders']
    out = {'link_gbit': gbit, 'layout': '{}x{}'.format(nodes, k), 'bytes': avg['bytes'], 'bound_s': bound,
           'contenders': c, 'tuning': avg['tuning'], 'meta': avg['meta']}
    for name, v in c.items():
        v['ratio_to_bound'] = v['median_s'] / bound if bound else None
    fixed = [n for n in FIXED if n in c]
    if 'auto_powersgd' in c and fixed:
        best = min(fixed, key=lambda n: c[n]['median_s'])
        out['auto_powersgd_over_best_fixed'] = c['auto_powersgd']['median_s'] / c[best]['median_s']
        out['auto_powersgd_over_best_fixed_paired'] = statistics.median(
            a / b for a, b in zip(c['auto_powersgd']['times_s'], c[best]['times_s']))
        out['best_fixed'] = best
    return out


def _targets(rows, iters):
    t = {}
    for r in rows:
        c, pre = r['contenders'], '{} {}'.format(_link_name(r['link_gbit']), r['layout'])
        if r['bound_s'] and 'powersgd_r4' in c:
            t[pre + ' PowerSGD r4 / float32 link bound (<= 0.10)'] = c['powersgd_r4']['ratio_to_bound']
            if 'bfloat16' in c:
                t[pre + ' bfloat16 / float32 link bound (for reference: 0.51)'] = c['bfloat16']['ratio_to_bound']
        if r['link_gbit'] is None and 'auto_powersgd_over_best_fixed' in r:
            t[pre + ' auto+PowerSGD / best fixed, medians (<= 1.05)'] = r['auto_powersgd_over_best_fixed']
            t[pre + ' auto+PowerSGD / best fixed, per-round (<= 1.05)'] = r['auto_powersgd_over_best_fixed_paired']
    for it in iters:
        c, pre = it['contenders'], 'iteration {} {}'.format(_link_name(it['link_gbit']), it['layout'])
        if 'powersgd_r4' in c:
            p = c['powersgd_r4']['median_s']
            t[pre + ' float32 / PowerSGD (>= 3)'] = c['float32']['median_s'] / p if 'float32' in c else None
            t[pre + ' bfloat16 / PowerSGD (>= 1.5)'] = c['bfloat16']['median_s'] / p if 'bfloat16' in c else None
    return t


def _table(result):
    lines = []
    for r in result['average']:
        lines.append('== ResNet-50 set {} at {}: {:.4g} MB, float32 link bound {}'.format(
            r['layout'], _link_name(r['link_gbit']), r['bytes'] / 1e6,
            '-' if r['bound_s'] is None else '{:.0f} ms'.format(r['bound_s'] * 1e3)))
        for n, c in sorted(r['contenders'].items(), key=lambda kv: kv[1]['median_s']):
            extra = ''
            if c.get('choice'):
                extra = ' (chose {})'.format(c['choice'])
            if c.get('last_call', {}).get('bytes'):
                extra += ' ({:.3g} MB on the wire)'.format(c['last_call']['bytes'] / 1e6)
            lines.append('  {:<16s} median {:8.1f} ms  min {:8.1f} ms  /bound {}{}'.format(
                n, c['median_s'] * 1e3, c['min_s'] * 1e3,
                '-' if c['ratio_to_bound'] is None else '{:.3f}'.format(c['ratio_to_bound']), extra))
        lines.append('  load average before/after: {} / {}'.format(
            ', '.join('{:.1f}'.format(v) for v in r['meta']['loadavg_before']),
            ', '.join('{:.1f}'.format(v) for v in r['meta']['loadavg_after'])))
    for it in result['iteration']:
        side = it.get('input_shape', [0, 0, 64, 64])[-1]
        lines.append('== ResNet-50 iterations {} at {} (batch {} per rank, {}x{})'.format(
            it['layout'], _link_name(it['link_gbit']), it['batch'], side, side))
        for n, c in sorted(it['contenders'].items(), key=lambda kv: kv[1]['median_s']):
            lines.append('  {:<16s} median {:8.1f} ms  min {:8.1f} ms'.format(n, c['median_s'] * 1e3,
                                                                           c['min_s'] * 1e3))
    lines.append('== targets')
    for k, v in result['targets'].items():
        lines.append('  {:<64s} {}'.format(k, '-' if v is None else '{:.3f}'.format(v)))
    return '\n'.join(lines)


def plot(result, path):
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    rows = [r for r in result['average'] if r['link_gbit'] is not None]
    if not rows:
        return
    fig, axes = plt.subplots(1, len(rows), figsize=(4.2 * len(rows), 3.6), squeeze=False)
    for ax, r in zip(axes[0], rows):
        names = [n for n in ('float32', 'float16', 'bfloat16', 'auto', 'powersgd_r4', 'auto_powersgd')
                 if n in r['contenders']]
        vals = [r['contenders'][n]['median_s'] * 1e3 for n in names]
        ax.bar(range(len(names)), vals, color=['C0', 'C1', 'C2', 'C4', 'C3', 'C5'][:len(names)])
        ax.axhline(r['bound_s'] * 1e3, color='k', ls='--', lw=1, label='float32 link bound')
        ax.axhline(0.1 * r['bound_s'] * 1e3, color='k', ls=':', lw=1, label='0.10 x bound (target)')
        ax.set_xticks(range(len(names)))
        ax.set_xticklabels([n.replace('_', '\n') for n in names], fontsize=8)
        ax.set_ylabel('ms per average (median)')
        ax.set_title('ResNet-50 gradients, {} {}'.format(r['layout'], _link_name(r['link_gbit'])), fontsize=9)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def run(args):
    from chainermn.cluster import Cluster
    from chainermn.cluster._net import BURST_SECONDS
    result = {'meta': {'command': ' '.join([os.path.relpath(sys.executable, ROOT)] + sys.argv),
                       'started_utc': time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime()),
                       'cpu_count': os.cpu_count(), 'loadavg_before': os.getloadavg()},
              'average': [], 'iteration': []}
    layouts = _parse_layouts(args.layouts)
    iter_links = _parse_links(args.iter_links) if args.iters else []
    work = tempfile.mkdtemp(prefix='chainermn-hooks-bench-')
    for gbit in _parse_links(args.links):
        with Cluster(nodes=2, link_gbit=gbit) as cluster:
            for n, k in layouts:
                tag = '{}x{} {}'.format(n, k, _link_name(gbit))
                out = os.path.join(work, 'avg.json')
                if args.average:
                    _job(cluster, [os.path.join(HERE, 'hooks_bench.py'), '--part', 'average', '--size',
                                   args.size, '--rounds', str(args.rounds), '--calls', str(args.calls),
                                   '--settle', repr(3 * BURST_SECONDS if gbit else 0.0), '--out', out],
                         k, args.timeout, 'average ' + tag)
                    with open(out) as f:
                        result['average'].append(_row(json.load(f), n, k, gbit))
                if gbit in iter_links:
                    out = os.path.join(work, 'iter.json')
                    _job(cluster, [os.path.join(HERE, 'hooks_bench.py'), '--part', 'iteration', '--rounds',
                                   str(args.iters), '--batch', str(args.batch), '--image', str(args.image),
                                   '--out', out],
                         k, args.timeout, 'iteration ' + tag)
                    with open(out) as f:
                        it = json.load(f)
                    it.update({'link_gbit': gbit, 'layout': '{}x{}'.format(n, k)})
                    result['iteration'].append(it)
    result['targets'] = _targets(result['average'], result['iteration'])
    result['meta']['loadavg_after'] = os.getloadavg()
    os.makedirs(args.out_dir, exist_ok=True)
    with open(os.path.join(args.out_dir, 'hooks_cluster.json'), 'w') as f:
        json.dump(result, f, indent=1)
    print(_table(result))
    if args.plot:
        plot(result, os.path.join(args.out_dir, 'hooks_cluster.png'))
    return result


def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--layouts', default='2x1,2x2')
    p.add_argument('--links', default='1,none', help='link rates in Gbit/s; none = unthrottled')
    p.add_argument('--size', choices=('tiny', 'full'), default='full')
    p.add_argument('--rounds', type=int, default=5)
    p.add_argument('--calls', type=int, default=1)
    p.add_argument('--iter-links', default='1')
    p.add_argument('--iters', type=int, default=3, help='timed iteration rounds (0: no iterations)')
    p.add_argument('--batch', type=int, default=32)
    p.add_argument('--image', type=int, default=64, help='image side of the iterations (pixels)')
    p.add_argument('--no-average', dest='average', action='store_false',
                   help='time whole iterations only')
    p.add_argument('--timeout', type=float, default=1800)
    p.add_argument('--no-plot', dest='plot', action='store_false')
    p.add_argument('--out-dir', default=os.path.join(HERE, 'hooks_results'))
    args = p.parse_args()
    from chainermn.cluster import missing
    problems = missing(need_tc=any(g is not None for g in _parse_links(args.links)))
    if problems:
        sys.exit('bench/hooks_cluster.py: cannot build a cluster of namespaces here; missing: ' + '; '.join(problems))
    run(args)


if __name__ == '__main__':
    main()
