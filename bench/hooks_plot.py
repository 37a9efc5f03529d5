"""Draw the accuracy curves of bench/hooks_accuracy.py and print the final accuracies against exact.

Usage: python bench/hooks_plot.py RESULT.json [RESULT.json ...] --png OUT.png
Results of one rank count are merged; where two hold the same model, the later on the command
line wins (e.g. a longer run of one model).  Per rank count and model it plots the mean validation accuracy over the seeds
after each epoch (the band: min and max over the seeds) for exact averaging and every PowerSGD
rank, and prints per model, rank count and hook the final accuracy (mean of the seeds) and its
difference from exact averaging in percentage points.
"""

import argparse
import json

import numpy


def _merge(results):
    """Return one result per rank count: each model's runs from the last result that has it."""
    by_ranks = {}
    for res in results:
        mine = by_ranks.setdefault(res['meta']['ranks'], {'meta': dict(res['meta']), 'runs': []})
        models = {r['model'] for r in res['runs']}
        mine['runs'] = [r for r in mine['runs'] if r['model'] not in models] + res['runs']
    return [by_ranks[k] for k in sorted(by_ranks)]


def summary(results):
    """Return rows (model, ranks, hook, mean final accuracy, difference to exact in pp, finals)."""
    rows = []
    for res in results:
        ranks = res['meta']['ranks']
        by = {}
        for run in res['runs']:
            by.setdefault((run['model'], run['hook']), []).append(run['accuracy'][-1])
        for (model, hook), finals in sorted(by.items()):
            exact = numpy.mean(by[(model, 'exact')]) if (model, 'exact') in by else None
            mean = float(numpy.mean(finals))
            rows.append((model, ranks, hook, mean, None if exact is None else 100 * (mean - exact), finals))
    return rows


def plot(results, path):
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    models = sorted({r['model'] for res in results for r in res['runs']}, key=lambda m: m != 'mlp')
    fig, axes = plt.subplots(len(models), len(results), figsize=(4.4 * len(results), 3.3 * len(models)),
                             squeeze=False)
    titles = {'mlp': "Quick start's MLP, digits 8x8", 'cnn': 'CNN, digits upscaled to 28x28'}
    for i, model in enumerate(models):
        for j, res in enumerate(results):
            ax = axes[i][j]
            hooks = sorted({r['hook'] for r in res['runs'] if r['model'] == model}, key=lambda h: h != 'exact')
            for k, hook in enumerate(hooks):
                curves = numpy.array([r['accuracy'] for r in res['runs']
                                      if r['model'] == model and r['hook'] == hook]) * 100
                epochs = numpy.arange(1, curves.shape[1] + 1)
                label = 'exact' if hook == 'exact' else hook.replace('powersgd-r', 'PowerSGD rank ')
                ax.plot(epochs, curves.mean(axis=0), color='C{}'.format(k), label=label,
                        lw=2 if hook == 'exact' else 1.2)
                ax.fill_between(epochs, curves.min(axis=0), curves.max(axis=0), color='C{}'.format(k),
                                alpha=0.15)
            epochs_run = max((len(r['accuracy']) for r in res['runs'] if r['model'] == model), default=0)
            ax.set_title('{}, {} ranks, {} epochs'.format(titles.get(model, model), res['meta']['ranks'],
                                                         epochs_run), fontsize=9)
            ax.set_xlabel('epoch')
            ax.set_ylabel('validation accuracy (%)')
            ax.set_ylim(80, 100)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7, loc='lower right')
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('results', nargs='+')
    p.add_argument('--png', default=None)
    args = p.parse_args()
    results = []
    for path in args.results:
        with open(path) as f:
            results.append(json.load(f))
    results = _merge(results)
    print('{:<5s} {:>5s} {:<13s} {:>10s} {:>12s}  finals'.format('model', 'ranks', 'hook', 'final %',
                                                                 'vs exact pp'))
    for model, ranks, hook, mean, diff, finals in summary(results):
        print('{:<5s} {:>5d} {:<13s} {:>10.2f} {:>12s}  {}'.format(
            model, ranks, hook, 100 * mean, '-' if diff is None or hook == 'exact' else '{:+.2f}'.format(diff),
            ' '.join('{:.2f}'.format(100 * f) for f in finals)))
    if args.png:
        plot(results, args.png)


if __name__ == '__main__':
    main()
