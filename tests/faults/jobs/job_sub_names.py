"""Fault job (issue 55): messages about a sub-communicator name ranks by their world rank (3 ranks).

``comm.split`` makes groups {0, 2} and {1}.  On the sub-communicator {0, 2}: a shape mismatch and
one rank's invalid input, each caught on both ranks (each prints ``MESSAGE <world rank>`` and its
message, and ``POINTER <world rank>`` and the line it would print if it did not catch it); then
world rank 2 calls ``sys.exit(4)`` while world rank 0 waits in the sub-communicator's all-reduce
(and world rank 1 in a world ``bcast_obj``).
"""

import sys

import numpy

import chainermn_comm
from chainermn_comm import CommunicationError, voice


def say(text):
    """Write ``text`` and a newline with one call (the ranks' output then never interleaves inside it)."""
    sys.stdout.write(text + '\n')
    sys.stdout.flush()


def show(comm, e):
    say('MESSAGE {}\n{}\nEND\nPOINTER {} {}'.format(comm.rank, e, comm.rank, voice.pointer_line(e)))


def main():
    comm = chainermn_comm.create_communicator('naive')
    assert comm.size == 3
    sub = comm.split(comm.rank % 2, comm.rank)
    x = numpy.ones(3, numpy.float32)
    sub.allreduce(x)
    if comm.rank != 1:
        try:  # shape mismatch: (4,) on world rank 0, (5,) on world rank 2
            sub.allreduce(numpy.ones(4 if comm.rank == 0 else 5, numpy.float32))
        except CommunicationError as e:
            show(comm, e)
        try:  # invalid input on world rank 2 (sub rank 1)
            sub.allreduce(numpy.array(['a']) if comm.rank == 2 else x)
        except CommunicationError as e:
            show(comm, e)
        except TypeError as e:
            say('MESSAGE {}\n{}: {}\nEND'.format(comm.rank, type(e).__name__, e))
        sub.allreduce(x)
    comm.barrier() if hasattr(comm, 'barrier') else comm.bcast_obj(None)
    if comm.rank == 2:
        sys.stdout.flush()
        sys.exit(4)
    if comm.rank == 0:
        sub.allreduce(x)
    else:
        comm.bcast_obj(None, root=0)
    print('job ran to the end')


if __name__ == '__main__':
    main()
