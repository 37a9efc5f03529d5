"""How long a checkpoint stops training: synchronous writes against background writes.

Usage: python bench/checkpoint_stall.py [--ranks 2] [--size full|tiny] [--iters 16] [--every 4]
       [--rounds 1] [--dir DIR] [--niceness N]

Each rank holds ResNet-50's parameters (bench/models.py) with Adam's state (m, v: 307 MB per
rank at full size) and runs Adam updates as its iterations (the ranks meet at a small
all-reduce after each, as data-parallel training does at its gradient all-reduce); every
``--every`` iterations it saves through the multi-node checkpointer the way the extension does
(``settle()``, then ``save``; in the background, ``poll()`` every iteration until the ranks agreed
on the write), first with ``background=False``, then with the default ``background=True`` (``--rounds`` such
pairs, one after the other, so that both modes meet the machine's drifts alike).  Prints, per mode,
the stall per save (the time the save call keeps the rank) and the part of it spent waiting
for the previous write (a write that had not finished by the next save: the machine had no
CPU to spare for it), the iterations while a background write runs against the others, and
the ratios, and how many iterations after its save each background write was agreed on and
what a poll costs; and what background saves cost training in all: the mean iteration (saves
included) against the synchronous mode's iterations that neither save nor follow a save.
Keep it short on a shared machine.
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
sys.path.insert(0, HERE)


class _State:
    """What a snapshot holds here: the model and its optimizer."""

    def __init__(self, link, opt):
        self.link = link
        self.opt = opt

    def serialize(self, serializer):
        self.link.serialize(serializer['model'])
        self.opt.serialize(serializer['optimizer'])


def _worker(args):
    import chainer
    import numpy

    import chainermn_comm
    from chainermn_train import create_multi_node_checkpointer
    from models import make_link, param_shapes

    comm = chainermn_comm.create_communicator('naive')
    from chainermn_train.checkpoint.write import background as write_background
    if args.niceness is not None:   # what this bench compares; the library's default otherwise
        write_background.WRITER_NICENESS = args.niceness
    if args.spread is not None:
        write_background.SPREAD = args.spread
    link = make_link(param_shapes('resnet50', args.size), seed=comm.rank)
    opt = chainer.optimizers.Adam()
    opt.setup(link)
    opt.update()   # Adam's state (m, v) exists from here
    state = _State(link, opt)
    step = numpy.zeros(1, numpy.float32)
    results = {}
    for background in (False, True) * args.rounds:
        path = tempfile.mkdtemp(prefix='ckpt-stall-', dir=args.dir) if comm.rank == 0 else None
        path = comm.bcast_obj(path)
        cp = create_multi_node_checkpointer('stall', comm, path=path, background=background,
                                            cp_interval=2, gc_interval=1)
        stalls, waits, during, others, lags, every = [], [], [], [], [], []
        saved = None   # the iteration of the save not agreed on yet
        begun = time.perf_counter()
        for it in range(1, args.iters + 1):
            busy = cp._flight.running
            start = time.perf_counter()
            opt.update()
            comm.allreduce(step)   # the ranks meet every iteration, as at the gradient all-reduce
            if saved is not None and cp.poll():   # what the extension's trigger does
                lags.append(it - saved)
                saved = None
            took = time.perf_counter() - start
            busy = busy or cp._flight.running   # the write ran during some of this iteration
            if it > 1:   # the first one warms caches up
                (during if busy else others).append(took)
            if it % args.every == 0:
                start = time.perf_counter()
                waited = cp.get_stats()['wait_seconds']
                cp.settle()
                cp.save(state, iteration=it)
                stalls.append(time.perf_counter() - start)
                waits.append(cp.get_stats()['wait_seconds'] - waited)
                saved = it if background else None
            elif it % args.every != 1 and it > args.every:   # the steady iterations of the mode
                every.append(took)
        elapsed = time.perf_counter() - begun
        cp.settle()
        polls = cp.get_stats()['polls']
        poll_s = cp.get_stats()['poll_seconds'] / polls if polls else 0.0
        idle = []
        if background:   # a poll's own cost: nothing in flight, the ranks in step
            for _ in range(50):
                comm.mpi_comm.Barrier()
                start = time.perf_counter()
                cp.poll()
                idle.append(time.perf_counter() - start)
        cp.finalize()
        comm.allreduce_obj(0)
        if comm.rank == 0:
            shutil.rmtree(path, ignore_errors=True)
        got = results.setdefault('background' if background else 'sync', {
            'stalls': [], 'waits': [], 'during': [], 'others': [], 'lags': [], 'every': [],
            'polls': 0, 'poll_s': [], 'poll_idle_s': [], 'elapsed': 0.0, 'iters': 0})
        for key, value in (('stalls', stalls), ('waits', waits), ('during', during),
                           ('others', others), ('lags', lags), ('every', every),
                           ('poll_idle_s', idle)):
            got[key] += value
        got['polls'] += polls
        got['poll_s'].append(poll_s)
        got['elapsed'] += elapsed
        got['iters'] += args.iters
        got['bytes'] = cp.get_stats()['bytes_saved'] // max(1, cp.get_stats()['saves'])
    views = comm.gather_obj(results)
    if comm.rank == 0:
        print('RESULT ' + json.dumps(views), flush=True)


def _report(views, args):
    def med(xs):
        return statistics.median(xs) if xs else float('nan')

    print('checkpoint stall: {} ranks, ResNet-50 ({}) + Adam, {} MB per rank per save, a save every '
          '{} iterations, {} iterations'.format(len(views), args.size,
                                                 views[0]['sync']['bytes'] >> 20, args.every,
                                                 args.iters))
    print('{:>6} {:>12} {:>12} {:>12} {:>14} {:>14} {:>10}'.format(
        'rank', 'mode', 'stall/save s', 'of it wait s', 'iter (write) s', 'iter (other) s',
        'iter ratio'))
    rows = []
    for r, view in enumerate(views):
        for mode in ('sync', 'background'):
            v = view[mode]
            during = v['during'] if mode == 'background' else []
            ratio = med(during) / med(v['others']) if during else float('nan')
            print('{:>6} {:>12} {:>12.3f} {:>12.3f} {:>14.3f} {:>14.3f} {:>10.2f}'.format(
                r, mode, med(v['stalls']), med(v['waits']), med(during), med(v['others']), ratio))
            rows.append((mode, med(v['stalls']), ratio))
    sync = med([s for m, s, _ in rows if m == 'sync'])
    bg = med([s for m, s, _ in rows if m == 'background'])
    print('stall per save, background / sync: {:.3f} ({:.3f} s / {:.3f} s; target <= 0.15); '
          'iterations during a background write / others: {:.2f} (target <= 1.10)'.format(
              bg / sync, bg, sync, med([x for m, _, x in rows if m == 'background'])))
    steady = med([x for v in views for x in v['sync']['every']])
    mean_bg = med([v['background']['elapsed'] / v['background']['iters'] for v in views])
    mean_sync = med([v['sync']['elapsed'] / v['sync']['iters'] for v in views])
    print('all in: an iteration with background saves takes {:.3f} s on average (saves included), '
          '{:.2f}x a synchronous-mode iteration that neither saves nor follows a save ({:.3f} s); '
          'with synchronous saves {:.3f} s ({:.2f}x); the most a background save stopped a rank: '
          '{:.3f} s (the first: its staging buffer is new)'.format(
              mean_bg, mean_bg / steady, steady, mean_sync, mean_sync / steady,
              max(x for v in views for x in v['background']['stalls'])))
    lags = [x for view in views for x in view['background']['lags']]
    print('agreement on a background write: {} iteration(s) after its save (median; max {}); a poll '
          '(one all-reduce of two integers) every iteration while it runs: {:.1f} us on average '
          '({} polls; waiting for the other rank included), {:.1f} us alone (median of 50 with the '
          'ranks in step)'.format(med(lags), max(lags) if lags else 'n/a',
                                  1e6 * med([x for v in views for x in v['background']['poll_s']]),
                                  sum(v['background']['polls'] for v in views),
                                  1e6 * med([x for v in views for x in v['background']['poll_idle_s']])))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--ranks', type=int, default=2)
    p.add_argument('--size', choices=('full', 'tiny'), default='full')
    p.add_argument('--iters', type=int, default=16)
    p.add_argument('--every', type=int, default=4)
    p.add_argument('--rounds', type=int, default=1, help='sync/background pairs, one after the other')
    p.add_argument('--dir', default=None, help='where the snapshots go (default: the temp dir)')
    p.add_argument('--niceness', type=int, default=None,
                   help='niceness the writer thread adds (default: the library\'s WRITER_NICENESS)')
    p.add_argument('--spread', type=float, default=None,
                   help='part of the time between saves a write is spread over (default: the library\'s SPREAD)')
    p.add_argument('--worker', action='store_true', help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return _worker(args)
    from chainermn_comm.testing import run_mpi
    res = run_mpi([os.path.abspath(__file__), '--worker', '--size', args.size, '--iters',
                   str(args.iters), '--every', str(args.every), '--rounds', str(args.rounds)] + (['--dir', args.dir] if args.dir else [])
                  + (['--niceness', str(args.niceness)] if args.niceness is not None else [])
                  + (['--spread', str(args.spread)] if args.spread is not None else []),
                  args.ranks, timeout=900 * args.rounds)
    line = [ln for ln in res.stdout.splitlines() if ln.startswith('RESULT ')]
    if res.returncode != 0 or not line:
        sys.exit('the benchmark job failed (status {}):\n{}\n{}'.format(res.returncode, res.stdout[-4000:],
                                                                         res.stderr[-4000:]))
    _report(json.loads(line[0][len('RESULT '):]), args)


if __name__ == '__main__':
    main()
