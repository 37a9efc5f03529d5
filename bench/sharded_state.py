"""Optimizer state per rank and update time with and without shard_state=True (issue 52).

Run under MPI, e.g. ``mpiexec -n 2 .venv/bin/python bench/sharded_state.py --json``.  Both
optimizers (Adam on the ResNet-50 shapes, bench/models.py) are made and warmed up first
(``--warmup`` updates each: past the tuner's first updates, so that set-up and tuning are not
timed), then ``--repeats`` blocks of ``--updates`` updates run interleaved, unsharded then
sharded, in the same job (this VM's memory bandwidth drifts: a ratio is taken within one
repeat).  An update is the whole ``update()``: average + step (+ all-gather); each is timed from a
barrier to the slowest rank's end.  Rank 0 prints one line (or one JSON object): the bytes of
the update rules' state (sharded per rank, unsharded, the bound ``total/N + largest``), the
median update of each block, the ratio sharded/unsharded per repeat and its median, the fastest
update of each and their ratio (the least disturbed by other jobs), whether the shares moved
through node-shared memory, and the load average before and after.

``--only sharded`` (or ``unsharded``) runs one of the two and reports the peak RSS per rank
(``ru_maxrss``), to compare the memory of two separate runs.

``--count-link IFACE`` also counts the bytes on ``IFACE`` (``/sys/class/net/IFACE/statistics``,
sent plus received, this rank's node) around each timed update, between barriers, and reports the
median per update of each contender and their ratio (on a cluster of namespaces, one rank per node:
the bytes on that node's link).

``--cluster GBIT`` (as root, without mpiexec) builds a cluster of 2 namespace nodes joined by links
of GBIT Gbit/s (``none``: unthrottled; ``chainermn.cluster.Cluster``) and runs this bench on it at
``--ranks-per-node`` ranks per node with ``--count-link eth0``, e.g.
``.venv/bin/python bench/sharded_state.py --cluster 1 --json``.  The nodes share this machine's
cores.
"""

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy  # noqa: E402

import models  # noqa: E402


class _Contender:
    """One model and its multi-node optimizer, with the gradients every update starts from."""

    def __init__(self, comm, shard, shapes, iface=None):
        import chainer
        from chainermn_train import create_multi_node_optimizer
        self.comm = comm
        self.shard = shard
        self.link = models.make_link(shapes, seed=1)
        self.opt = create_multi_node_optimizer(chainer.optimizers.Adam(), comm,
                                               shard_state=shard).setup(self.link)
        self.grads = [p.grad.copy() for p in self.link.params()]
        self.iface = iface
        #: Bytes sent plus received on ``iface`` by each timed update (with ``iface``).
        self.link_bytes = []

    def run(self, n):
        """Return the seconds of each of ``n`` updates (the slowest rank's)."""
        from mpi4py import MPI
        times = []
        mpi = self.comm.mpi_comm
        for _ in range(n):
            for p, g in zip(self.link.params(), self.grads):
                p.grad[...] = g
            if self.iface:
                mpi.Barrier()
                before = _link_counter(self.iface)
            mpi.Barrier()
            started = time.perf_counter()
            self.opt.update()
            took = numpy.array([time.perf_counter() - started])
            if self.iface:
                mpi.Barrier()  # every rank has received what this rank sent
                self.link_bytes.append(_link_counter(self.iface) - before)
            mpi.Allreduce(MPI.IN_PLACE, took, MPI.MAX)
            times.append(float(took[0]))
        return times


def _link_counter(iface):
    total = 0
    for key in ('tx_bytes', 'rx_bytes'):
        with open('/sys/class/net/{}/statistics/{}'.format(iface, key)) as f:
            total += int(f.read())
    return total


def _state_bytes(c):
    from chainermn_train import _sharded
    return _sharded.state_bytes(c.opt)


def _only(comm, args, shapes):
    import resource
    c = _Contender(comm, args.only == 'sharded', shapes)
    c.run(args.warmup)
    took = float(numpy.median(c.run(args.updates)))
    row = {'ranks': comm.size, 'rank': comm.rank, 'model': args.model, 'run': args.only,
           'state_bytes': _state_bytes(c), 'update_s': round(took, 4),
           'peak_rss_bytes': resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
    rows = comm.gather_obj(row)
    if comm.rank == 0:
        for r in rows:
            print(json.dumps(r))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--model', default='resnet50', choices=models.MODELS)
    ap.add_argument('--size', default='full', choices=('full', 'tiny'))
    ap.add_argument('--warmup', type=int, default=12,
                    help='untimed updates of each optimizer first (the tuner settles within 10)')
    ap.add_argument('--updates', type=int, default=5, help='timed updates per block')
    ap.add_argument('--repeats', type=int, default=3, help='interleaved blocks of each')
    ap.add_argument('--json', action='store_true')
    ap.add_argument('--only', choices=('sharded', 'unsharded'))
    ap.add_argument('--count-link', metavar='IFACE', help='count the bytes on IFACE around each update')
    ap.add_argument('--cluster', metavar='GBIT',
                    help='run on a 2-node namespace cluster with links of GBIT Gbit/s (none: unthrottled)')
    ap.add_argument('--ranks-per-node', type=int, default=1, help='with --cluster')
    ap.add_argument('--timeout', type=float, default=1200, help='with --cluster: the job\'s hard timeout')
    args = ap.parse_args()
    if args.cluster:
        return _on_cluster(args)
    import chainermn_comm
    comm = chainermn_comm.create_communicator('naive')
    shapes = models.param_shapes(args.model, args.size)
    if args.only:
        _only(comm, args, shapes)
        return
    load_before = os.getloadavg()
    full = _Contender(comm, False, shapes, args.count_link)
    shard = _Contender(comm, True, shapes, args.count_link)
    full.run(args.warmup)
    shard.run(args.warmup)
    blocks = {'unsharded': [], 'sharded': []}
    every = {'unsharded': [], 'sharded': []}
    ratios = []
    for _ in range(args.repeats):
        ta, tb = full.run(args.updates), shard.run(args.updates)
        every['unsharded'] += ta
        every['sharded'] += tb
        a, b = float(numpy.median(ta)), float(numpy.median(tb))
        blocks['unsharded'].append(round(a, 4))
        blocks['sharded'].append(round(b, 4))
        ratios.append(round(b / a, 3))
    low = {k: min(v) for k, v in every.items()}
    largest = max(2 * p.array.nbytes for p in full.link.params())
    states = comm.gather_obj(_state_bytes(shard))
    shares = comm.averaging.shard_collectives()
    node = getattr(shares, 'on_node_shared_memory', lambda: None)()  # None: an older build
    total = _state_bytes(full)
    row = {'ranks': comm.size, 'model': args.model, 'state_bytes_unsharded': total,
           'state_bytes_sharded_per_rank': states, 'bound': total // comm.size + largest,
           'update_s_unsharded': blocks['unsharded'], 'update_s_sharded': blocks['sharded'],
           'ratio': ratios, 'ratio_median': float(numpy.median(ratios)),
           'update_s_min_unsharded': round(low['unsharded'], 4), 'update_s_min_sharded': round(low['sharded'], 4),
           'ratio_of_min': round(low['sharded'] / low['unsharded'], 3),
           'shares_through_node_shared_memory': node,
           'load_before': [round(x, 2) for x in load_before],
           'load_after': [round(x, 2) for x in os.getloadavg()]}
    if args.count_link:
        # Every rank's bytes on its node's link (one rank per node: the link's own).
        a = comm.allgather_obj(int(numpy.median(full.link_bytes)))
        b = comm.allgather_obj(int(numpy.median(shard.link_bytes)))
        row.update({'link_iface': args.count_link, 'link_bytes_unsharded': a, 'link_bytes_sharded': b,
                    'grad_bytes': sum(p.array.nbytes for p in full.link.params()),
                    'link_bytes_ratio': [round(y / x, 4) if x else None for x, y in zip(a, b)]})
    if comm.rank == 0:
        print(json.dumps(row) if args.json else
              'N={ranks}: state {state_bytes_sharded_per_rank} B per rank sharded vs {state_bytes_unsharded} B '
              '(bound {bound}); update sharded {update_s_sharded} s vs unsharded {update_s_unsharded} s: '
              'ratio {ratio} (median {ratio_median}; of the fastest updates {ratio_of_min}); node-shared shares: {shares_through_node_shared_memory}; '
              'load {load_before} -> {load_after}'.format(**row))

    if comm.rank == 0 and args.count_link and not args.json:
        print('bytes on {link_iface} per update and rank: sharded {link_bytes_sharded} vs unsharded '
              '{link_bytes_unsharded} (ratio {link_bytes_ratio}; gradient {grad_bytes} B)'.format(**row))


def _on_cluster(args):
    """Run this bench on a 2-node namespace cluster (``--cluster``); print what rank 0 printed."""
    from chainermn.cluster import Cluster, missing
    gbit = None if args.cluster.lower() == 'none' else float(args.cluster)
    problems = missing(need_tc=gbit is not None)
    if problems:
        sys.exit('bench/sharded_state.py: cannot build a cluster of namespaces here; missing: ' +
                 '; '.join(problems))
    argv = [os.path.abspath(__file__), '--model', args.model, '--size', args.size, '--warmup',
            str(args.warmup), '--updates', str(args.updates), '--repeats', str(args.repeats),
            '--count-link', 'eth0'] + (['--json'] if args.json else [])
    env = {'OPENBLAS_NUM_THREADS': '1', 'OMP_NUM_THREADS': '1', 'PYTHONUNBUFFERED': '1'}
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with Cluster(nodes=2, link_gbit=gbit) as cluster:
        res = cluster.mpiexec(argv, ranks_per_node=args.ranks_per_node, timeout=args.timeout, env=env,
                              cwd=root)
    if res.returncode != 0:
        sys.exit('bench/sharded_state.py: the cluster job failed with status {}{}\n{}\n{}'.format(
            res.returncode, ' (timed out: raise --timeout)' if res.timed_out else '',
            res.stdout[-4000:], res.stderr[-4000:]))
    cores = len(os.sched_getaffinity(0))
    ranks = 2 * args.ranks_per_node
    for line in res.stdout.splitlines():
        if line.startswith(('{', 'N=', 'bytes on')):
            if line.startswith('{'):
                row = json.loads(line)
                row.update({'cluster': '2x{}'.format(args.ranks_per_node), 'link_gbit': gbit,
                            'cores': cores, 'ranks_per_core': round(ranks / cores, 3)})
                line = json.dumps(row)
            print(line)
    if not args.json:
        print('cluster 2x{} at {} Gbit/s on {} cores: {:.3g} ranks per core'.format(
            args.ranks_per_node, 'unthrottled' if gbit is None else gbit, cores, ranks / cores))


if __name__ == '__main__':
    main()
