"""Cluster job: rank 0 sends BYTES to rank 1 (on another node); rank 0 writes the seconds it took.

usage: job_send.py OUT_DIR BYTES    (writes OUT_DIR/send.0.json)
"""

import json
import os
import sys
import time

import numpy
from mpi4py import MPI


def main(out_dir, nbytes):
    comm = MPI.COMM_WORLD
    buf = numpy.ones(nbytes, numpy.uint8)
    comm.Barrier()
    start = time.perf_counter()
    if comm.rank == 0:
        comm.Send(buf, 1)
    elif comm.rank == 1:
        comm.Recv(buf, 0)
    comm.Barrier()
    seconds = time.perf_counter() - start
    if comm.rank == 0:
        with open(os.path.join(out_dir, 'send.0.json'), 'w') as f:
            json.dump({'rank': 0, 'bytes': nbytes, 'seconds': seconds}, f)


if __name__ == '__main__':
    main(sys.argv[1], int(sys.argv[2]))
