"""``python -m chainermn doctor``: check an MPI/GPU set-up and say what to fix.

Automates the manual's Step-by-Step Troubleshooting: the MPI library mpi4py is linked against
versus the mpiexec on PATH, the "every process is rank 0" mismatch, ranks/hosts and the
intra/inter layout, a collective round trip with a value check, CuPy/NCCL/GPUs, whether MPI is
CUDA-aware, the links' latency and bandwidth within and between nodes, and the environment
variables the manual names.  Works alone and under ``mpiexec -n N`` (rank 0 prints the table).
Exit status 1 when a check FAILs.
"""

import argparse
import sys

from chainermn_comm.install_hints import MPI_INSTALL_HINT
from chainermn_tools._args import seconds
from chainermn_tools.doctor import _checks
from chainermn_tools.doctor._report import FAIL, Row, render, summary

__all__ = ['main', 'run_checks']


def run_checks(timeout=60.0, cuda_aware=True, links=True):
    """Run every check on every rank; return (rows, is_printer) -- rows are complete on rank 0."""
    rows = []
    try:
        from mpi4py import MPI
    except Exception as e:
        rows.append(Row('mpi4py', FAIL, 'cannot import mpi4py.MPI: {}: {}'.format(
            type(e).__name__, ' '.join(str(e).split())), MPI_INSTALL_HINT))
        return rows, True
    return _checks.run_all(MPI, timeout=timeout, cuda_aware=cuda_aware, links=links)


def main(argv=None):
    """Command-line entry point; return the exit status."""
    parser = argparse.ArgumentParser(prog='python -m chainermn doctor', description=__doc__.split('\n')[0])
    parser.add_argument('--timeout', type=seconds(), default=60.0,
                        help='seconds any collective may take before the check fails (default 60)')
    parser.add_argument('--no-cuda-aware-check', action='store_true',
                        help='skip the CUDA-aware MPI test (it launches `mpiexec -n 2`)')
    parser.add_argument('--no-links', action='store_true',
                        help='skip measuring latency and bandwidth within and between nodes')
    args = parser.parse_args(argv)
    rows, printer = run_checks(timeout=args.timeout, cuda_aware=not args.no_cuda_aware_check,
                              links=not args.no_links)
    verdict, status = summary(rows)
    if printer:
        sys.stdout.write(render(rows) + '\n\n' + verdict + '\n')
        sys.stdout.flush()
    return status
