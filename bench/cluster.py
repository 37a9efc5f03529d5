"""Gradient averaging across nodes joined by links of a set rate (``python -m chainermn cluster``).

Usage (as root, from the repo root):
    .venv/bin/python bench/cluster.py [--layouts 2x1,2x2] [--links 1,10,none]
        [--models resnet50,mlp] [--size full|tiny] [--rounds R] [--calls K] [--out-dir DIR]
        [--no-iteration]

For every link rate a cluster of namespaces is built (``chainermn.cluster.Cluster``); on it, for
every layout NODESxRANKS, ``bench/allreduce_bench.py`` runs our contenders interleaved over rounds
(ours float32, float16, bfloat16 and ``auto`` with their knobs tuned, the three wires with fixed
default knobs, per-array MPI ``Allreduce``, the packed MPI floor in 4 MiB chunks, and PyTorch
gloo flat and in DDP's 25 MB buckets when ``torch`` is importable; contenders that tune run
their schedule first, timed apart, and its cost is reported in updates), then the peer
(Chainer 7.8.1's bundled ``naive``) in its own job next to that job's own floor.  The link bound
is 2(N-1)/N x S / rate (N nodes, S gradient bytes; half of it in float16).  Then
``bench/iteration.py`` runs whole iterations of ResNet-50 (plain, ``overlap=True``, float16,
compute only, the average alone; the peer in its own job).  Writes ``cluster.json`` (every figure)
and ``cluster.png`` (time against link rate) into ``--out-dir`` and prints the table.
"""

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import report  # noqa: E402

__all__ = ['link_bound', 'main']

OURS = report.OURS
OURS_FP16 = 'ours_naive_fp16_multi_node_mean_grad'
OURS_BF16 = 'ours_naive_bf16_multi_node_mean_grad'
OURS_AUTO = 'ours_naive_auto_multi_node_mean_grad'
FIXED = ('ours_fixed_float32', 'ours_fixed_float16', 'ours_fixed_bfloat16')
PEER = report.PEER
FLOOR = 'floor_packed_chunked'
PER_ARRAY = 'per_array_allreduce'
GLOO = ('gloo_flat_allreduce', 'gloo_ddp_buckets25MB_allreduce')
LABELS = {OURS: 'ours float32', OURS_FP16: 'ours float16', OURS_BF16: 'ours bfloat16', OURS_AUTO: 'ours auto',
          FIXED[0]: 'ours float32, fixed knobs', FIXED[1]: 'ours float16, fixed knobs',
          FIXED[2]: 'ours bfloat16, fixed knobs', PER_ARRAY: 'per-array MPI Allreduce',
          FLOOR: 'packed MPI floor (4 MiB chunks)', PEER: 'peer (Chainer 7.8.1 naive)',
          GLOO[0]: 'gloo flat', GLOO[1]: 'gloo 25 MB buckets',
          'peerjob_' + FLOOR: 'packed MPI floor, peer job'}
ITER_MODES = 'plain,overlap,compute,allreduce,plain_fp16,overlap_fp16,allreduce_fp16,plain_auto,overlap_auto'
#: The iteration modes that average (exposed communication = their time - compute only).
ITER_AVERAGING = ('plain', 'overlap', 'plain_fp16', 'overlap_fp16', 'plain_auto', 'overlap_auto')
ITER_PEER_MODES = 'peer_plain,peer_allreduce,compute'
#: x position of the unthrottled link on the plot (Gbit/s axis).
UNTHROTTLED_X = 100.0


def link_bound(nbytes, nodes, gbit, itemsize_ratio=1.0):
    """Return the seconds a node's link needs for its share of an all-reduce of ``nbytes`` (None: no limit)."""
    if gbit is None or nodes < 2:
        return None
    return 2.0 * (nodes - 1) / nodes * nbytes * itemsize_ratio / (gbit * 1e9 / 8)


def _parse_links(text):
    return [None if v.strip().lower() in ('none', 'unthrottled', '0') else float(v) for v in text.split(',')]


def _parse_layouts(text):
    out = []
    for v in text.split(','):
        n, k = v.lower().split('x')
        out.append((int(n), int(k)))
    return out


def _link_name(gbit):
    return 'unthrottled' if gbit is None else '{:g} Gbit/s'.format(gbit)


def _job(cluster, argv, ranks_per_node, timeout, what):
    env = {'OPENBLAS_NUM_THREADS': '1', 'OMP_NUM_THREADS': '1', 'MKL_NUM_THREADS': '1',
           'PYTHONUNBUFFERED': '1'}
    t0 = time.monotonic()
    res = cluster.mpiexec(argv, ranks_per_node=ranks_per_node, timeout=timeout, env=env, cwd=ROOT)
    if res.returncode != 0:
        raise SystemExit('bench/cluster.py: {} failed with status {}{} after {:.0f}s\n--- stdout ---\n{}\n'
                         '--- stderr ---\n{}'.format(what, res.returncode,
                                                     ' (timed out: raise --timeout)' if res.timed_out else '',
                                                     res.seconds, res.stdout[-4000:], res.stderr[-4000:]))
    print('[cluster] {} done in {:.0f}s'.format(what, time.monotonic() - t0), file=sys.stderr, flush=True)


def _allreduce_jobs(cluster, nodes, k, args, work):
    from chainermn.cluster._net import BURST_SECONDS
    tag = '{}x{}'.format(nodes, k)
    common = ['--size', args.size, '--models', args.models, '--rounds', str(args.rounds),
              '--calls', str(args.calls),
              '--warmup', str(args.warmup), '--grad-scale', repr(args.grad_scale),
              # Every contender starts on a full token bucket (three times its refill time).
              '--settle', repr(3 * BURST_SECONDS)]
    ours_out = os.path.join(work, 'ours.json')
    only = [OURS, OURS_FP16, OURS_BF16, OURS_AUTO, PER_ARRAY, FLOOR] + list(FIXED) + list(GLOO)
    _job(cluster, [os.path.join(HERE, 'allreduce_bench.py')] + common
         + ['--only', ','.join(only), '--gloo', '--out', ours_out], k, args.timeout, 'all-reduce ' + tag)
    peer_out = os.path.join(work, 'peer.json')
    _job(cluster, ['-S', os.path.join(HERE, 'allreduce_bench.py'), '--peer'] + common
         + ['--only', ','.join([PEER, FLOOR]), '--out', peer_out], k, args.timeout, 'peer all-reduce ' + tag)
    with open(ours_out) as f, open(peer_out) as g:
        return report.merge(json.load(f), json.load(g))


def _iteration_jobs(cluster, nodes, k, args, work):
    tag = '{}x{}'.format(nodes, k)
    common = ['--worker', '--size', args.size, '--models', 'resnet', '--iters', str(args.iters),
              '--warmup', '1'] + (['--batch', str(args.batch)] if args.batch else [])
    out = {}
    for peer, modes in ((False, ITER_MODES), (True, ITER_PEER_MODES)):
        path = os.path.join(work, 'iter_{}.json'.format('peer' if peer else 'ours'))
        argv = (['-S'] if peer else []) + [os.path.join(HERE, 'iteration.py')] + common + [
            '--modes', modes, '--out', path] + (['--peer'] if peer else [])
        _job(cluster, argv, k, args.timeout, '{}iteration {}'.format('peer ' if peer else '', tag))
        with open(path) as f:
            (entry,) = json.load(f).values()
        out['peer' if peer else 'ours'] = entry
    return out


def _entry(model_result, nodes, k, gbit):
    """Return one row of the JSON: every contender's times, ratios to the bound and to the peer."""
    nbytes = model_result['bytes']
    bound = link_bound(nbytes, nodes, gbit)
    bound16 = link_bound(nbytes, nodes, gbit, 0.5)
    peer = model_result['contenders'].get(PEER, {}).get('median_s')
    rows = {}
    for name, c in model_result['contenders'].items():
        med, mn = c['median_s'], c['min_s']
        row = {'median_s': med, 'min_s': mn, 'times_s': c['times_s'],
               'ratio_to_bound': med / bound if bound else None,
               'ratio_to_peer': med / peer if peer else None,
               'speedup_over_peer': peer / med if peer else None}
        if name in (OURS_FP16, OURS_BF16, FIXED[1], FIXED[2]):
            row['ratio_to_fp16_bound'] = med / bound16 if bound16 else None
        rows[name] = row
    tuning = {}
    for name, t in model_result.get('tuning', {}).items():
        steady = rows.get(name, {}).get('median_s')
        # Call 1 sets up buffers and shared memory whatever the configuration: not a tuning cost.
        extra = sum(t['times_s'][1:]) - (len(t['times_s']) - 1) * steady if steady else None
        tuning[name] = dict(t, cost_updates=extra / steady if steady else None)
    fixed = [rows[n]['median_s'] for n in (OURS, OURS_FP16, OURS_BF16) + FIXED if n in rows]
    auto = rows.get(OURS_AUTO, {}).get('median_s')
    paired, best_name = _paired_auto_ratio(rows)
    return {'link_gbit': gbit, 'layout': '{}x{}'.format(nodes, k), 'nodes': nodes, 'ranks_per_node': k,
            'bytes': nbytes, 'arrays': model_result['arrays'], 'bound_s': bound, 'bound_fp16_s': bound16,
            'contenders': rows, 'tuning': tuning, 'precision': model_result.get('precision', {}),
            'auto_over_best_fixed': auto / min(fixed) if auto and fixed else None,
            'auto_over_best_fixed_paired': paired, 'best_fixed': best_name}


def _paired_auto_ratio(rows):
    """Return the median over rounds of auto / the best fixed contender of the same round, and its name.

    The best fixed contender is the one with the lowest median.  Rounds run every contender one
    after the other, so a round's ratio cancels what the machine did during that round; the
    minimum of six noisy medians (``auto_over_best_fixed``) is biased low by the noise itself.
    """
    names = [n for n in (OURS, OURS_FP16, OURS_BF16) + FIXED if n in rows]
    if OURS_AUTO not in rows or not names:
        return None, None
    best = min(names, key=lambda n: rows[n]['median_s'])
    return statistics.median(a / b for a, b in zip(rows[OURS_AUTO]['times_s'], rows[best]['times_s'])), best


def _iteration_entry(it, nodes, k, gbit):
    ours, peer = it['ours'], it['peer']
    med = ours['median_s']
    e = {'link_gbit': gbit, 'layout': '{}x{}'.format(nodes, k), 'grad_bytes': ours['grad_bytes'],
         'model': ours['model'],
         'batch': ours['batch'], 'input_shape': ours['input_shape'], 'overlap_mode': ours.get('overlap_mode'),
         'ours': ours, 'peer': peer}
    comp = med['compute']
    e['exposed_s'] = {m: med[m] - comp for m in ITER_AVERAGING if m in med}
    e['tuning'] = ours.get('tuning', {})
    e['exposed_s']['peer_plain'] = peer['median_s']['peer_plain'] - peer['median_s']['compute']
    e['exposed_over_allreduce_alone'] = {
        'overlap': e['exposed_s']['overlap'] / med['allreduce'],
        'overlap_fp16': e['exposed_s']['overlap_fp16'] / med['allreduce_fp16'],
        'plain': e['exposed_s']['plain'] / med['allreduce']}
    e['overlap_over_plain'] = med['overlap'] / med['plain']
    e['overlap_fp16_over_plain'] = med['overlap_fp16'] / med['plain']
    fixed = [med[m] for m in ('overlap', 'overlap_fp16', 'plain', 'plain_fp16') if m in med]
    best = min(fixed + [med[m] for m in ('plain_auto', 'overlap_auto') if m in med])
    if 'overlap_auto' in med:
        e['overlap_auto_over_best_fixed'] = med['overlap_auto'] / min(fixed)
    e['speedup_over_peer'] = {m: peer['median_s']['peer_plain'] / med[m] for m in ITER_AVERAGING if m in med}
    e['speedup_over_peer']['best'] = peer['median_s']['peer_plain'] / best
    return e


def _targets(rows, iters):
    """Return the issues' targets with the measured ratio for each (None where not measured)."""
    def find(model, layout, gbit):
        for r in rows:
            if r['model'] == model and r['layout'] == layout and r['link_gbit'] == gbit:
                return r
        return None

    def med(r, name):
        c = r and r['contenders'].get(name)
        return c['median_s'] if c else None

    def ratio(a, b):
        return a / b if a and b else None

    t = {}
    for model in sorted({r['model'] for r in rows}, key=lambda m: m != 'resnet50'):
        for layout in ('2x1', '2x2'):
            for gbit in (1.0, 10.0, None):
                r = find(model, layout, gbit)
                pre = '{} {} {}'.format(model, _link_name(gbit), layout)
                t[pre + ' auto/best fixed (<= 1.05)'] = r and r['auto_over_best_fixed']
                t[pre + ' auto/best fixed, median of per-round ratios (<= 1.05)'] = \
                    r and r.get('auto_over_best_fixed_paired')
                cost = r and r['tuning'].get(OURS_AUTO, {}).get('cost_updates')
                t[pre + ' auto tuning cost, updates (<= 10)'] = cost
                if gbit == 1.0:
                    t[pre + ' bf16/float32 bound (<= 0.55)'] = ratio(med(r, OURS_BF16), r and r['bound_s'])
                else:
                    t[pre + ' bf16/float32 (<= 1)'] = ratio(med(r, OURS_BF16), med(r, OURS))
                err = r and r['precision'].get(OURS_BF16, {}).get('rel_error_2norm')
                t[pre + ' bf16 mean rel. error (<= 2**-8 = 0.0039)'] = err
        for layout in ('2x1', '2x2'):
            r = find(model, layout, 1.0)
            t['{} 1G {} ours/bound (<= 1.10)'.format(model, layout)] = ratio(med(r, OURS), r and r['bound_s'])
            t['{} 1G {} fp16/float32 bound (<= 0.55)'.format(model, layout)] = ratio(
                med(r, OURS_FP16), r and r['bound_s'])
            t['{} 1G {} peer/fp16 (>= 1.8)'.format(model, layout)] = ratio(med(r, PEER), med(r, OURS_FP16))
        for gbit in (10.0, None):
            name = _link_name(gbit)
            r = find(model, '2x2', gbit)
            t['{} {} 2x2 peer/ours (>= 1.5)'.format(model, name)] = ratio(med(r, PEER), med(r, OURS))
            r = find(model, '2x1', gbit)
            t['{} {} 2x1 ours/floor (<= 1.05)'.format(model, name)] = ratio(med(r, OURS), med(r, FLOOR))
            t['{} {} 2x1 peer/ours (> 1)'.format(model, name)] = ratio(med(r, PEER), med(r, OURS))
            t['{} {} 2x1 gloo flat/ours (>= 1.3)'.format(model, name)] = ratio(med(r, GLOO[0]), med(r, OURS))
    for it in iters:
        if it['link_gbit'] == 1.0:
            x = it['exposed_over_allreduce_alone']
            pre = 'iteration 1G {}'.format(it['layout'])
            t[pre + ' exposed overlap/average alone (<= 0.30)'] = x['overlap']
            t[pre + ' exposed overlap fp16/fp16 average alone (<= 0.30)'] = x['overlap_fp16']
            t[pre + ' overlap/plain (<= 1)'] = it['overlap_over_plain']
            t[pre + ' overlap auto/best fixed (<= 1.05)'] = it.get('overlap_auto_over_best_fixed')
            t[pre + ' speedup over peer, best of ours'] = it['speedup_over_peer']['best']
    return t


def _fmt_ms(v):
    return '-' if v is None else '{:.1f}'.format(v * 1e3)


def _fmt_x(v):
    if v is not None and 0 < abs(v) < 0.01:
        return '{:.1e}'.format(v)
    return '-' if v is None else '{:.2f}'.format(v)


def format_table(result):
    """Return the printed report: per run the contenders' median/min and ratios, then the targets."""
    lines = []
    if result['meta'].get('warning'):
        lines.append('WARNING: ' + result['meta']['warning'])
    for r in result['allreduce']:
        lines.append('== {} {} at {}: {:.4g} MB, link bound {} ms (float16 {} ms)'.format(
            r['model'], r['layout'], _link_name(r['link_gbit']), r['bytes'] / 1e6, _fmt_ms(r['bound_s']),
            _fmt_ms(r['bound_fp16_s'])))
        lines.append('  {:<34s} {:>9s} {:>9s} {:>9s} {:>9s}'.format('contender', 'median ms', 'min ms',
                                                                  '/bound', '/peer'))
        for name, c in sorted(r['contenders'].items(), key=lambda kv: kv[1]['median_s']):
            label = LABELS.get(name, name.replace('peerjob_', 'peer job: '))
            lines.append('  {:<34s} {:>9s} {:>9s} {:>9s} {:>9s}'.format(
                label, _fmt_ms(c['median_s']), _fmt_ms(c['min_s']), _fmt_x(c['ratio_to_bound']),
                _fmt_x(c['ratio_to_peer'])))
        for name, tn in sorted(r.get('tuning', {}).items()):
            lines.append('  tuning of {}: {} calls, {:.0f} ms, cost {} updates; chose {}'.format(
                LABELS.get(name, name), tn['calls'], tn['seconds'] * 1e3, _fmt_x(tn['cost_updates']),
                ', '.join('{}={}'.format(k, v) for k, v in sorted(tn['choice'].items()))))
        if r.get('auto_over_best_fixed'):
            lines.append('  auto / best fixed: {} (medians); {} (median of per-round ratios against {})'.format(
                _fmt_x(r['auto_over_best_fixed']), _fmt_x(r.get('auto_over_best_fixed_paired')),
                LABELS.get(r.get('best_fixed'), r.get('best_fixed'))))
        for name, pr in sorted(r.get('precision', {}).items()):
            lines.append('  precision of {} ({} on the wire): relative error {}'.format(
                LABELS.get(name, name), pr['wire'], _fmt_x(pr['rel_error_2norm'])))
    for it in result['iteration']:
        o, p = it['ours']['median_s'], it['peer']['median_s']
        lines.append('== iteration {} batch {} {} at {} (median ms; exposed = iteration - compute)'.format(
            it['model'], it['batch'], it['layout'], _link_name(it['link_gbit'])))
        lines.append('  compute {}  average alone {} (float16 {})  peer compute {}  peer average alone {}'.format(
            _fmt_ms(o['compute']), _fmt_ms(o['allreduce']), _fmt_ms(o['allreduce_fp16']),
            _fmt_ms(p['compute']), _fmt_ms(p['peer_allreduce'])))
        for m in ITER_AVERAGING:
            if m not in o:
                continue
            lines.append('  {:<14s} iteration {:>8s}  exposed {:>8s}  speedup over peer {}'.format(
                m, _fmt_ms(o[m]), _fmt_ms(it['exposed_s'][m]), _fmt_x(it['speedup_over_peer'][m])))
        for m, tn in sorted(it.get('tuning', {}).items()):
            lines.append('  tuning of {}: {} iterations, {:.0f} ms'.format(m, tn['calls'], tn['seconds'] * 1e3))
        lines.append('  {:<14s} iteration {:>8s}  exposed {:>8s}'.format(
            'peer', _fmt_ms(p['peer_plain']), _fmt_ms(it['exposed_s']['peer_plain'])))
    lines.append('== targets (measured ratio)')
    for k, v in result['targets'].items():
        lines.append('  {:<66s} {}'.format(k, _fmt_x(v)))
    return '\n'.join(lines)


def plot(result, path):
    """Draw time against link rate, one line per contender, the link bounds dashed; save to ``path``."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    rows = result['allreduce']
    models = sorted({r['model'] for r in rows})
    layouts = sorted({r['layout'] for r in rows})
    fig, axes = plt.subplots(len(models), len(layouts), figsize=(6 * len(layouts), 4.5 * len(models)),
                             squeeze=False)
    for i, model in enumerate(models):
        for j, layout in enumerate(layouts):
            ax = axes[i][j]
            sel = sorted((r for r in rows if r['model'] == model and r['layout'] == layout),
                         key=lambda r: r['link_gbit'] or UNTHROTTLED_X)
            names = sorted({n for r in sel for n in r['contenders']})
            for name in names:
                pts = [(r['link_gbit'] or UNTHROTTLED_X, r['contenders'][name]['median_s'] * 1e3)
                       for r in sel if name in r['contenders']]
                ax.plot(*zip(*pts), marker='o', label=LABELS.get(name, name))
            rates = [r['link_gbit'] for r in sel if r['link_gbit']]
            if rates and len({r['bytes'] for r in sel}) == 1:
                # The bound is S' / rate: a straight line on log-log axes, drawn across the rates.
                xs = [min(rates) * 0.7, max(rates) * 1.4]
                for ratio, style, label in ((1.0, 'k--', 'link bound float32'), (0.5, 'k:', 'link bound float16')):
                    ys = [link_bound(sel[0]['bytes'], sel[0]['nodes'], x, ratio) * 1e3 for x in xs]
                    ax.plot(xs, ys, style, label=label)
            ax.set_xscale('log')
            ax.set_yscale('log')
            xs = sorted({r['link_gbit'] or UNTHROTTLED_X for r in sel})
            ax.set_xticks(xs)
            ax.set_xticklabels(['unthrottled' if x == UNTHROTTLED_X else '{:g}'.format(x) for x in xs])
            ax.set_xlabel('link rate (Gbit/s)')
            ax.set_ylabel('all-reduce time, median (ms)')
            ax.set_title('{} ({:.4g} MB), {} nodes x ranks'.format(model, sel[0]['bytes'] / 1e6 if sel else 0,
                                                                    layout))
            ax.grid(True, which='both', alpha=0.3)
            ax.legend(fontsize=7)
    if result['meta'].get('warning'):
        fig.suptitle(result['meta']['warning'], fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run(args):
    from chainermn.cluster import Cluster
    os.makedirs(args.out_dir, exist_ok=True)
    load = os.getloadavg()
    result = {'meta': {'command': ' '.join([os.path.relpath(sys.executable, ROOT)] + sys.argv),
                       'started_utc': time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime()),
                       'cpu_count': os.cpu_count(), 'grad_scale': args.grad_scale,
                       'loadavg_before': load, 'size': args.size,
                       'rounds': args.rounds, 'warmup': args.warmup, 'iters': args.iters,
                       'models': args.models.split(','), 'layouts': args.layouts, 'links': args.links,
                       'jobs': {}},
              'allreduce': [], 'iteration': []}
    if load[0] > (os.cpu_count() or 1) * 1.5:
        result['meta']['warning'] = ('taken under load (1-minute load average {:.1f} on {} cores): '
                                     'compare with a quiet run before drawing conclusions'
                                     .format(load[0], os.cpu_count()))
    layouts = _parse_layouts(args.layouts)
    iter_links = _parse_links(args.iter_links) if args.iteration else []
    for gbit in _parse_links(args.links):
        for nodes in sorted({n for n, _ in layouts}):
            with Cluster(nodes=nodes, link_gbit=gbit) as cluster:
                for n, k in layouts:
                    if n != nodes:
                        continue
                    work = tempfile.mkdtemp(prefix='chainermn-bench-{}x{}-'.format(n, k))
                    merged = _allreduce_jobs(cluster, n, k, args, work)
                    result['meta']['jobs']['{} {}x{}'.format(_link_name(gbit), n, k)] = merged['meta']
                    for model, m in merged['models'].items():
                        row = _entry(m, n, k, gbit)
                        row['model'] = model
                        result['allreduce'].append(row)
                    if gbit in iter_links:
                        it = _iteration_jobs(cluster, n, k, args, work)
                        result['iteration'].append(_iteration_entry(it, n, k, gbit))
                    shutil.rmtree(work, ignore_errors=True)
    result['targets'] = _targets(result['allreduce'], result['iteration'])
    result['meta']['loadavg_after'] = os.getloadavg()
    json_path = os.path.join(args.out_dir, 'cluster.json')
    with open(json_path, 'w') as f:
        json.dump(result, f, indent=1)
    print(format_table(result))
    if args.plot:
        plot(result, os.path.join(args.out_dir, 'cluster.png'))
    print('[cluster] wrote {}{}'.format(json_path, ' and cluster.png' if args.plot else ''), file=sys.stderr)
    return result


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--layouts', default='2x1,2x2', help='NODESxRANKS_PER_NODE, comma-separated')
    p.add_argument('--links', default='1,10,none', help='link rates in Gbit/s; none = unthrottled')
    p.add_argument('--models', default='resnet50,mlp', help='gradient sets of bench/models.py')
    p.add_argument('--size', choices=('tiny', 'full'), default='full')
    p.add_argument('--rounds', type=int, default=None, help='timed rounds (default 7 full, 2 tiny)')
    p.add_argument('--calls', type=int, default=1,
                   help="all-reduce calls per contender and round; the round's sample is their median")
    p.add_argument('--warmup', type=int, default=1)
    p.add_argument('--grad-scale', type=float, default=1.0,
                   help='standard deviation of the random gradients of the all-reduce runs (float16 '
                        'casts slow down where values fall below 6.1e-5, float16\'s smallest normal)')
    p.add_argument('--no-iteration', dest='iteration', action='store_false',
                   help='skip the whole-iteration benchmark')
    p.add_argument('--iter-links', default='1', help='link rates at which whole iterations run')
    p.add_argument('--iters', type=int, default=None, help='timed iterations (default 5 full, 2 tiny)')
    p.add_argument('--batch', type=int, default=None,
                   help='ResNet-50 batch per rank, 64x64 images (default 32 full: compute and the '
                        '1 Gbit/s average of the same order; tiny: a small ResNet)')
    p.add_argument('--timeout', type=float, default=1800, help='hard limit per MPI job, seconds')
    p.add_argument('--no-plot', dest='plot', action='store_false', help='skip the PNG (no matplotlib)')
    p.add_argument('--out-dir', default=os.path.join(HERE, 'cluster_results'))
    args = p.parse_args(argv)
    if args.rounds is None:
        args.rounds = 7 if args.size == 'full' else 2
    if args.iters is None:
        args.iters = 5 if args.size == 'full' else 2
    if args.batch is None and args.size == 'full':
        args.batch = 32
    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            p.error('the plot needs matplotlib: pip install -r bench/requirements.txt (or pass --no-plot)')
    from chainermn.cluster import missing
    problems = missing(need_tc=any(g is not None for g in _parse_links(args.links)))
    if problems:
        sys.exit('bench/cluster.py: cannot build a cluster of namespaces here; missing: ' + '; '.join(problems))
    run(args)


if __name__ == '__main__':
    main()
