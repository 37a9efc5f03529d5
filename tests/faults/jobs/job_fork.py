"""Fault job (issue 55): rank 1 fork()s helper children that end in every way while the job trains.

Usage: job_fork.py [hook]

Each round rank 1 forks one child per way of ending (``sys.exit(0)``, ``sys.exit(3)``,
``os._exit(0)``, ``os._exit(5)``, an uncaught exception, ``raise SystemExit(4)``, the builtin
``exit(2)``, falling off the end of its function); none touches MPI.  While rank 1 waits
for each child the other ranks wait in the next all-reduce: a notice from the child would end
the job.  Five rounds; then every rank prints ``job ran to the end: <sum>``.  ``hook``: the
global except hook is installed too (a child's error or non-zero exit must not abort the job).

A child that ends through Python's exit would also run mpi4py's ``MPI_Finalize`` on the MPI
state it inherited (MPICH's then waits in a PMI barrier, or aborts the job, with plain mpi4py
too): as a program that forks helpers must, this one turns mpi4py's automatic finalize off and
finalizes the ranks itself.
"""

import os
import sys

import mpi4py

mpi4py.rc.finalize = False

import numpy  # noqa: E402

import chainermn_comm  # noqa: E402

WAYS = ('exit0', 'exit3', '_exit0', '_exit5', 'raise', 'systemexit4', 'builtin_exit2', 'return')
ROUNDS = 5


def child(way):
    """End this fork()ed child the way ``way`` says (returns for 'return': its program then ends)."""
    if way == 'exit0':
        sys.exit(0)
    if way == 'exit3':
        sys.exit(3)
    if way == '_exit0':
        os._exit(0)
    if way == '_exit5':
        os._exit(5)
    if way == 'raise':
        raise RuntimeError('injected failure in a forked child')
    if way == 'systemexit4':
        raise SystemExit(4)
    if way == 'builtin_exit2':
        exit(2)  # noqa: the builtin (site's), as a script calls it
    # 'return': main() returns at once, so the child's program ends normally


def main(hook=None):
    if hook == 'hook':
        chainermn_comm.global_except_hook.add_hook()
    comm = chainermn_comm.create_communicator('naive')
    x = numpy.ones(8, numpy.float32)
    total = 0.0
    comm.allreduce(x)
    statuses = []
    for _ in range(ROUNDS):
        for way in WAYS:
            if comm.rank == 1:
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    child(way)
                    return
                _, status = os.waitpid(pid, 0)
                statuses.append((way, os.WEXITSTATUS(status) if os.WIFEXITED(status) else -1))
            total += float(comm.allreduce(x)[0])
    if comm.rank == 1:
        print('children: ' + ' '.join('{}={}'.format(w, s) for w, s in statuses[:len(WAYS)]))
    print('job ran to the end: {:g}'.format(total))
    sys.stdout.flush()
    comm.finalize()
    from mpi4py import MPI
    MPI.Finalize()


if __name__ == '__main__':
    main(*sys.argv[1:])
