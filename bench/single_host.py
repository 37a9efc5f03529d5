"""One host, N ranks: our gradient average against the in-place chunked MPI floor and older commits.

Usage (from the repo root):
    .venv/bin/python bench/single_host.py [-n 2] [--rounds 15] [--size full|tiny]
        [--old 606ba57[,COMMIT...]] [--models resnet50] [--out FILE.json]

Each older commit's ``chainermn_comm`` (default 606ba57, the code of 2026-11-23) is taken out of
git with ``git archive`` into a temporary folder and renamed ``chainermn_comm_<commit>`` (imports
rewritten), so that one MPI job holds them all and every round times, in a shuffled order that
is the same on every rank:

- ``ours``: ``create_communicator('naive').multi_node_mean_grad(link)`` of the checkout, after
  its tuner has finished its first schedule (those calls are timed apart: ``tuning``);
- ``old_<commit>``: the same call of an older commit (called as often before the rounds);
- ``floor``: the gradients packed once into one array, all-reduced in place in 4 MiB slices
  (``Allreduce(IN_PLACE)``), no averaging: what MPI alone needs for the bytes.

Each contender's time is the slowest rank's.  Printed: medians and minima, the median of the
per-round ratios to the floor and ours/old; also the minor page faults and the CPU time per
call (``resource.getrusage``, rank 0), which depend less on the machine's load.
"""

import argparse
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import report  # noqa: E402

CHUNK = 4 * 1024 * 1024


def old_name(commit):
    return 'chainermn_comm_' + re.sub(r'\W', '_', commit)


def extract_old(commit, dest):
    """Write ``commit``'s chainermn_comm into ``dest``/chainermn_comm_<commit> with imports renamed."""
    src = 'packages/chainermn-comm/src/chainermn_comm'
    tar = subprocess.run(['git', '-C', ROOT, 'archive', commit, src], check=True, capture_output=True).stdout
    subprocess.run(['tar', '-x', '-C', dest], input=tar, check=True)
    renamed = old_name(commit)
    pkg = os.path.join(dest, renamed)
    shutil.move(os.path.join(dest, src), pkg)
    shutil.rmtree(os.path.join(dest, 'packages'))
    pattern = re.compile(r'\bchainermn_comm\b')
    for folder, _, files in os.walk(pkg):
        for name in files:
            if name.endswith('.py'):
                path = os.path.join(folder, name)
                with open(path) as f:
                    text = f.read()
                with open(path, 'w') as f:
                    f.write(pattern.sub(renamed, text))
    return dest


def _worker(args):
    import resource

    import numpy
    from mpi4py import MPI

    import models
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    shapes = models.param_shapes(args.model, args.size)
    link = models.make_link(shapes, seed=rank)
    grads = [p.grad for _, p in sorted(link.namedparams())]
    flat = numpy.concatenate([g.reshape(-1) for g in grads])
    step = CHUNK // flat.itemsize

    def floor():
        for s in range(0, flat.size, step):
            comm.Allreduce(MPI.IN_PLACE, flat[s:s + step], MPI.SUM)

    import chainermn_comm
    ours = chainermn_comm.create_communicator('naive')
    cont = {'floor': floor, 'ours': lambda: ours.multi_node_mean_grad(link)}
    if args.variants:
        # The same average without the agreement check (CHAINERMN_CHECK=0): what the check costs.
        unchecked = chainermn_comm.create_communicator('naive')
        unchecked._guard.check = False
        cont['ours_unchecked'] = lambda: unchecked.multi_node_mean_grad(link)
    if args.old_path:
        sys.path.insert(0, args.old_path)
        for commit in args.old.split(','):
            old = __import__(old_name(commit)).create_communicator('naive')
            cont['old_' + commit] = lambda c=old: c.multi_node_mean_grad(link)
    # Ours tunes over its first calls: run them now, timed apart, and as many calls of the others.
    tuning, t_tune = 0, 0.0
    for n, fn in cont.items():
        if n.startswith('ours_'):
            fn()  # its first call decides its path and its tuner's axes
    while tuning < 60:
        comm.Barrier()
        t0 = time.perf_counter()
        ours.multi_node_mean_grad(link)
        t_tune += comm.allreduce(time.perf_counter() - t0, op=MPI.MAX)
        tuning += 1
        tuned = getattr(ours, '_tuned', None)
        if tuned is None or tuned.tuning.tuner is None or not tuned.tuning.tuner.tuning:
            break
    for n, fn in cont.items():
        for _ in range(tuning if n.startswith('old_') else 0):
            fn()
    tuner = ours._tuned.tuning.tuner if getattr(ours, '_tuned', None) else None
    names = sorted(cont)
    times = {n: [] for n in names}
    faults = {n: [] for n in names}
    cpu = {n: [] for n in names}
    for r in range(args.warmup + args.rounds):
        order = list(names)
        random.Random(r).shuffle(order)
        for n in order:
            comm.Barrier()
            u0 = resource.getrusage(resource.RUSAGE_SELF)
            t0 = time.perf_counter()
            cont[n]()
            dt = time.perf_counter() - t0
            u1 = resource.getrusage(resource.RUSAGE_SELF)
            dt = comm.allreduce(dt, op=MPI.MAX)
            if r >= args.warmup:
                times[n].append(dt)
                faults[n].append(u1.ru_minflt - u0.ru_minflt)
                cpu[n].append((u1.ru_utime + u1.ru_stime) - (u0.ru_utime + u0.ru_stime))
    if rank == 0:
        out = {'model': args.model, 'size': args.size, 'bytes': int(flat.nbytes), 'ranks': comm.Get_size(),
               'times_s': times, 'minflt': faults, 'cpu_s': cpu,
               'tuning': {'calls': tuning, 'seconds': t_tune,
                          'history': [] if tuner is None else [
                              (c, f, {k: str(v) for k, v in ch.items()}) for c, f, ch in tuner.history]}}
        with open(args.out, 'w') as f:
            json.dump(out, f)


def summarize(data):
    """Return medians, minima and the medians of per-round ratios of one worker's result."""
    t = data['times_s']
    s = {'median_s': {n: statistics.median(v) for n, v in t.items()},
         'min_s': {n: min(v) for n, v in t.items()},
         'minflt_median': {n: statistics.median(v) for n, v in data['minflt'].items()},
         'cpu_median_s': {n: statistics.median(v) for n, v in data['cpu_s'].items()},
         'ratio_median': {}}
    pairs = [(n, 'floor') for n in sorted(t) if n != 'floor'] + [('ours', n) for n in sorted(t)
                                                                  if n.startswith('old_')]
    for a, b in pairs:
        s['ratio_median']['{}/{}'.format(a, b)] = statistics.median(x / y for x, y in zip(t[a], t[b]))
    return s


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('-n', type=int, default=2, help='ranks (all on this host)')
    p.add_argument('--rounds', type=int, default=15)
    p.add_argument('--warmup', type=int, default=2)
    p.add_argument('--size', choices=('tiny', 'full'), default='full')
    p.add_argument('--models', default='resnet50')
    p.add_argument('--old', default='606ba57', help="older commits to compare with, comma-separated ('' for none)")
    p.add_argument('--out', default=None, help='write every figure to this JSON file')
    p.add_argument('--variants', action='store_true',
                   help='also time ours without the agreement check (ours_unchecked)')
    p.add_argument('--worker', action='store_true', help=argparse.SUPPRESS)
    p.add_argument('--model', default='resnet50', help=argparse.SUPPRESS)
    p.add_argument('--old-path', default='', help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        return _worker(args)
    py = sys.executable
    mpiexec = os.path.join(os.path.dirname(py), 'mpiexec')
    if not os.path.exists(mpiexec):
        mpiexec = shutil.which('mpiexec')
    tmp = tempfile.mkdtemp(prefix='chainermn-single-host-')
    result = {'meta': {'command': ' '.join(sys.argv), 'ranks': args.n, 'old': args.old,
                       'loadavg_before': os.getloadavg(), 'cpu_count': os.cpu_count()}, 'models': {}}
    try:
        old_path = ''
        for commit in filter(None, args.old.split(',')):
            old_path = extract_old(commit, tmp)
        for model in args.models.split(','):
            out = os.path.join(tmp, 'w.json')
            env = dict(os.environ, OPENBLAS_NUM_THREADS='1', OMP_NUM_THREADS='1', PYTHONUNBUFFERED='1')
            cmd = [mpiexec, '-n', str(args.n), py, os.path.abspath(__file__), '--worker', '--model', model,
                   '--size', args.size, '--rounds', str(args.rounds), '--warmup', str(args.warmup),
                   '--old', args.old, '--old-path', old_path, '--out', out] + (
                       ['--variants'] if args.variants else [])
            subprocess.run(cmd, check=True, cwd=ROOT, env=env, timeout=3600)
            with open(out) as f:
                data = json.load(f)
            data['summary'] = summarize(data)
            result['models'][model] = data
            s = data['summary']
            print('== {} ({:.4g} MB), {} ranks on one host, {} rounds (slowest rank per call)'.format(
                model, data['bytes'] / 1e6, args.n, args.rounds))
            print('  {:<16s} {:>10s} {:>9s} {:>12s} {:>10s}'.format('', 'median ms', 'min ms', 'minflt/call',
                                                                    'cpu ms'))
            for n in sorted(s['median_s']):
                print('  {:<16s} {:>10.1f} {:>9.1f} {:>12.0f} {:>10.1f}'.format(
                    n, s['median_s'][n] * 1e3, s['min_s'][n] * 1e3, s['minflt_median'][n],
                    s['cpu_median_s'][n] * 1e3))
            for k, v in s['ratio_median'].items():
                print('  median of per-round {:<24s} {:.3f}'.format(k, v))
            tn = data['tuning']
            print('  ours tuned over its first {} calls ({:.0f} ms in all): {}'.format(
                tn['calls'], tn['seconds'] * 1e3, tn['history'][-1][2] if tn['history'] else 'nothing to tune'))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return report.save(result, args.out)


if __name__ == '__main__':
    main()
