"""Fault job: the last rank skips one all-reduce, so the others block in it (deadlock)."""

import sys
import time

import numpy

import chainermn_comm


def main():
    comm = chainermn_comm.create_communicator('naive')
    x = numpy.ones((5, 7), dtype=numpy.float32)
    for _ in range(3):
        comm.allreduce(x)
    sys.stderr.write('FAULT-SKIP-AT={:.6f} rank={}\n'.format(time.time(), comm.rank))
    sys.stderr.flush()
    if comm.rank != comm.size - 1:
        comm.allreduce(x)
    comm.bcast_obj('next step')
    print('job ran to the end despite the skipped collective')


if __name__ == '__main__':
    main()
