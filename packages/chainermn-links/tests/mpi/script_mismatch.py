"""Deliberate send/recv mismatch: both ranks wait in functions.recv for each other."""

import os
import sys

import chainermn_comm
from chainermn_links import functions as mnf

comm = chainermn_comm.create_communicator('naive')
mode = sys.argv[1]
if mode == 'deadlock':
    mnf.recv(comm, 1 - comm.rank)            # nobody sends: the watchdog must abort the job
elif mode == 'wrong_kind':
    if comm.rank == 0:
        comm.send_obj('not an array message', 1, 0)
    else:
        try:
            mnf.recv(comm, 0)
        except chainermn_comm.CommunicationError as e:
            # one write: rank 0's line shares the pipe and would otherwise fall between the words
            os.write(1, 'CommunicationError: {}\n'.format(e).encode())
            sys.exit(3)
print('rank {} finished'.format(comm.rank), flush=True)
