"""Fault job (issue 55): every rank's all-reduce raises the shape mismatch together; rank 0 catches it.

Usage: job_agreed_caught.py [hook]

Rank 0 gives shape (4,), the others (5,): the agreement check raises the same error on every
rank, which rank 0 reports when it is not caught.  Rank 0 catches it, prints ``rank 0 caught
it`` and goes on into another all-reduce; the other ranks do not catch it.  ``hook``: the global
except hook is installed.
"""

import sys

import numpy

import chainermn_comm
from chainermn_comm import CommunicationError


def main(hook=None):
    if hook == 'hook':
        chainermn_comm.global_except_hook.add_hook()
    comm = chainermn_comm.create_communicator('naive')
    comm.allreduce(numpy.ones(3, numpy.float32))
    x = numpy.ones(4 if comm.rank == 0 else 5, numpy.float32)
    if comm.rank == 0:
        try:
            comm.allreduce(x)
        except CommunicationError:
            print('rank 0 caught it', flush=True)
        comm.allreduce(x)
        print('job ran to the end')
    else:
        comm.allreduce(x)


if __name__ == '__main__':
    main(*sys.argv[1:])
