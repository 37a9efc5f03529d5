"""Fault job: rank FAIL_RANK raises at iteration FAIL_AT of an all-reduce loop (run with the except hook on)."""

import sys
import time

import numpy

import chainermn_comm


def main(fail_rank, fail_at):
    comm = chainermn_comm.create_communicator('naive')
    x = numpy.arange(1000, dtype=numpy.float32)
    for it in range(10 ** 6):
        if comm.rank == fail_rank and it == fail_at:
            sys.stderr.write('FAULT-RAISED-AT={:.6f} rank={} iteration={}\n'.format(time.time(), comm.rank, it))
            sys.stderr.flush()
            raise RuntimeError('injected failure on rank {} at iteration {}'.format(comm.rank, it))
        comm.allreduce(x)
    print('job ran to the end without the injected failure')


if __name__ == '__main__':
    main(int(sys.argv[1]), int(sys.argv[2]))
