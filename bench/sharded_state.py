"""Optimizer state per rank and update time with and without shard_state=True (issue 52).

Run under MPI, e.g. ``mpiexec -n 2 .venv/bin/python bench/sharded_state.py --json``.  Every rank
prints one line (or one JSON object): the bytes of its update rules' state with Adam on the
ResNet-50 shapes (bench/models.py), sharded and not, the bound ``total/N + largest``, and the
mean time of one ``update()`` (average + step) over ``--updates`` updates after one warm-up.
``--only sharded`` (or ``unsharded``) runs one of the two and reports the peak RSS per rank
(``ru_maxrss``), to compare the memory of two separate runs.
"""

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy  # noqa: E402

import models  # noqa: E402


def _run(comm, shard, shapes, updates):
    import chainer
    from chainermn_train import _sharded, create_multi_node_optimizer
    link = models.make_link(shapes, seed=1)
    opt = create_multi_node_optimizer(chainer.optimizers.Adam(), comm, shard_state=shard).setup(link)
    grads = [p.grad.copy() for p in link.params()]
    times = []
    for i in range(updates + 1):
        for p, g in zip(link.params(), grads):
            p.grad[...] = g
        comm.mpi_comm.Barrier()
        started = time.perf_counter()
        opt.update()
        if i:
            times.append(time.perf_counter() - started)
    largest = max(2 * p.array.nbytes for p in link.params())
    return _sharded.state_bytes(opt), largest, float(numpy.mean(times)) if times else 0.0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--model', default='resnet50', choices=models.MODELS)
    ap.add_argument('--size', default='full', choices=('full', 'tiny'))
    ap.add_argument('--updates', type=int, default=3)
    ap.add_argument('--json', action='store_true')
    ap.add_argument('--only', choices=('sharded', 'unsharded'))
    args = ap.parse_args()
    import chainermn_comm
    comm = chainermn_comm.create_communicator('naive')
    shapes = models.param_shapes(args.model, args.size)
    if args.only:
        import resource
        state, _, took = _run(comm, args.only == 'sharded', shapes, args.updates)
        row = {'ranks': comm.size, 'rank': comm.rank, 'model': args.model, 'run': args.only,
               'state_bytes': state, 'update_s': round(took, 4),
               'peak_rss_bytes': resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
        rows = comm.gather_obj(row)
        if comm.rank == 0:
            for r in rows:
                print(json.dumps(r))
        return
    full, largest, t_full = _run(comm, False, shapes, args.updates)
    mine, _, t_shard = _run(comm, True, shapes, args.updates)
    row = {'ranks': comm.size, 'rank': comm.rank, 'model': args.model, 'state_bytes_unsharded': full,
           'state_bytes_sharded': mine, 'bound': full // comm.size + largest,
           'update_s_unsharded': round(t_full, 4), 'update_s_sharded': round(t_shard, 4)}
    rows = comm.gather_obj(row)
    if comm.rank == 0:
        for r in rows:
            print(json.dumps(r) if args.json else
                  'N={ranks} rank {rank}: state {state_bytes_sharded} B sharded vs {state_bytes_unsharded} B '
                  '(bound {bound}); update {update_s_sharded}s vs {update_s_unsharded}s'.format(**r))


if __name__ == '__main__':
    main()
