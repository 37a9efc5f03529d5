"""Rank 1 raises while the other ranks wait in a collective; how the job ends depends on argv[1].

add_hook: call chainermn_comm.global_except_hook.add_hook(); env: rely on
$CHAINERMN_FORCE_ABORT_ON_EXCEPTION; plain: nothing (used with ``python -m mpi4py``).
"""

import os
import sys
import time

import chainermn_comm

mode = sys.argv[1]
if mode == 'add_hook':
    chainermn_comm.global_except_hook.add_hook()
comm = chainermn_comm.create_communicator('naive', timeout=120)
sys.stdout.write('PID {}\n'.format(os.getpid()))
sys.stdout.flush()
comm.mpi_comm.Barrier()
if comm.rank == 1:
    sys.stderr.write('RAISE_AT {!r}\n'.format(time.time()))
    sys.stderr.flush()
    raise RuntimeError('injected failure on this rank')
comm.allreduce_obj(comm.rank)  # the others block here until the job is aborted
sys.stdout.write('UNREACHABLE rank {}\n'.format(comm.rank))
