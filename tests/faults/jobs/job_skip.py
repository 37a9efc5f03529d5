"""Fault job: the last rank skips one all-reduce, then ends (mode exit: a deadlock) or goes on (next)."""

import sys
import time

import numpy

import chainermn_comm


def main(mode):
    comm = chainermn_comm.create_communicator('naive')
    x = numpy.ones((5, 7), dtype=numpy.float32)
    for _ in range(3):
        comm.allreduce(x)
    sys.stderr.write('FAULT-SKIP-AT={:.6f} rank={}\n'.format(time.time(), comm.rank))
    sys.stderr.flush()
    if comm.rank != comm.size - 1:
        comm.allreduce(x)
    elif mode == 'exit':
        return  # the skipping rank ends its program: the others wait until the watchdog fires
    # mode 'next': the skipping rank's next collective meets the others' all-reduce: every rank
    # raises CommunicationError at once.
    comm.bcast_obj('next step')
    print('job ran to the end despite the skipped collective')


if __name__ == '__main__':
    main(sys.argv[1] if len(sys.argv) > 1 else 'exit')
