"""Launcher test job.  Usage: launch_job.py MODE [ARGS]

  bug          rank 0 raises the same RuntimeError on every start
  bugs         rank 0 raises a RuntimeError naming the restart number (a different one every start)
  preempt      exits 75 on every rank on the first start, finishes on the next
  hang DOWN    first start: rank 2 marks its host down (creates DOWN) and every rank then waits
               forever in a collective (rank 2 never joins it); later starts finish
  repair DOWN  first start: rank 0 repairs the host marked by DOWN (removes the file) and every rank
               exits 75; later starts finish
"""

import os
import sys
import threading

import chainermn

PREEMPTED = 75


def main(mode, *args):
    comm = chainermn.create_communicator('naive')
    restarts = int(os.environ.get('CHAINERMN_LAUNCH_RESTARTS', '0'))
    print('rank {} of {} started (restart {})'.format(comm.rank, comm.size, restarts), flush=True)
    if mode == 'bug' and comm.rank == 0:
        raise RuntimeError('injected bug on every start')
    if mode == 'bugs' and comm.rank == 0:
        raise RuntimeError('injected bug number {}'.format(restarts))
    if mode == 'preempt' and restarts == 0:
        comm.allreduce_obj(1)
        sys.exit(PREEMPTED)
    if mode == 'hang' and restarts == 0:
        if comm.rank == 2:
            open(args[0], 'w').close()
            threading.Event().wait()   # this node is gone: it never answers again
        comm.allreduce_obj(1)
    if mode == 'repair' and restarts == 0:
        if comm.rank == 0:
            os.remove(args[0])
        comm.allreduce_obj(1)
        sys.exit(PREEMPTED)
    total = comm.allreduce_obj(1)
    print('rank {} finished with {} rank(s)'.format(comm.rank, total), flush=True)


if __name__ == '__main__':
    main(*sys.argv[1:])
