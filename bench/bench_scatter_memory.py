"""Measure root's peak memory while scatter_dataset sends a numpy dataset of S MiB to 2 ranks.

Run one configuration:  mpiexec -n 2 python bench/bench_scatter_memory.py --size-mb 512 [--shuffle] [--max-buf-mb 256]
Run the usual table:    python bench/bench_scatter_memory.py --all   (launches mpiexec -n 2 per configuration)

Peak extra memory is root's peak RSS (getrusage ru_maxrss) minus its RSS right after building the
dataset, so it counts everything scatter_dataset holds on top of the dataset (pieces, buffers, index
arrays).  tracemalloc's peak shows the same for Python/NumPy allocations alone.
"""

import argparse
import os
import resource
import subprocess
import sys
import time
import tracemalloc

__all__ = ['main']


def _rss_bytes():
    with open('/proc/self/statm') as f:
        return int(f.read().split()[1]) * os.sysconf('SC_PAGE_SIZE')


def _peak_rss_bytes():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def run_one(size_mb, shuffle, max_buf_mb):
    import numpy
    from mpi4py import MPI

    import chainermn_comm
    import chainermn_data

    comm = chainermn_comm.create_communicator('naive')
    row = 1024  # float32 values per sample (4 KiB rows)
    n = size_mb * 1024 * 1024 // (4 * row)
    data = None
    if comm.rank == 0:
        data = numpy.empty((n, row), dtype=numpy.float32)
        data[...] = 1.0
        data[:, 0] = numpy.arange(n, dtype=numpy.float32)
    comm.mpi_comm.Barrier()
    before = _rss_bytes()
    tracemalloc.start()
    start = time.perf_counter()
    part = chainermn_data.scatter_dataset(data, comm, shuffle=shuffle, seed=0,
                                          max_buf_len=max_buf_mb * 1024 * 1024)
    seconds = time.perf_counter() - start
    _, traced_peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    extra = max(0, _peak_rss_bytes() - before)
    assert len(part) == (n + comm.size - 1) // comm.size
    if comm.rank == 0:
        nbytes = data.nbytes
        print('dataset {:.0f} MiB  shuffle={!s:5}  max_buf_len {:4d} MiB  time {:.2f} s  root peak extra RSS '
              '{:.1f} MiB ({:.3f} x dataset, {:.2f} x piece)  tracemalloc peak {:.1f} MiB'.format(
                  nbytes / 2 ** 20, shuffle, max_buf_mb, seconds, extra / 2 ** 20, extra / nbytes,
                  extra / (max_buf_mb * 2 ** 20), traced_peak / 2 ** 20), flush=True)
    MPI.COMM_WORLD.Barrier()


def run_all(size_mb):
    mpiexec = os.path.join(os.path.dirname(sys.executable), 'mpiexec')
    for shuffle in (False, True):
        for max_buf_mb in (256, 16):
            cmd = [mpiexec, '-n', '2', sys.executable, os.path.abspath(__file__), '--size-mb', str(size_mb),
                   '--max-buf-mb', str(max_buf_mb)] + (['--shuffle'] if shuffle else [])
            subprocess.run(cmd, check=True, timeout=600)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--size-mb', type=int, default=512)
    p.add_argument('--max-buf-mb', type=int, default=256)
    p.add_argument('--shuffle', action='store_true')
    p.add_argument('--all', action='store_true', help='run every configuration under mpiexec -n 2')
    args = p.parse_args()
    if args.all:
        run_all(args.size_mb)
    else:
        run_one(args.size_mb, args.shuffle, args.max_buf_mb)


if __name__ == '__main__':
    main()
