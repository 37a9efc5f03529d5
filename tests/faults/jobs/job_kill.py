"""Fault job: every rank loops on all-reduce; rank 1 writes its pid after a few iterations to be SIGKILLed."""

import os
import sys
import time

import numpy

import chainermn_comm


def main(pid_dir):
    comm = chainermn_comm.create_communicator('naive')
    x = numpy.ones(1 << 18, dtype=numpy.float32)
    deadline = time.monotonic() + 60
    it = 0
    while time.monotonic() < deadline:
        comm.allreduce(x)
        it += 1
        if it == 20 and comm.rank == 1:
            tmp = os.path.join(pid_dir, 'pid.1.tmp')
            with open(tmp, 'w') as f:
                f.write(str(os.getpid()))
            os.replace(tmp, os.path.join(pid_dir, 'pid.1'))
    print('job ran to the end: the kill never happened')


if __name__ == '__main__':
    main(sys.argv[1])
