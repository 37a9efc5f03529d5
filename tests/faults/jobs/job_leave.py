"""Fault job (issue 41): after three all-reduces the last rank leaves (or stops, or is slow) while the others go on.

Usage: job_leave.py MODE [PID_DIR | SECONDS]

Modes of the last rank, while every other rank makes one more all-reduce:
``return`` (its program returns), ``exit3`` (``sys.exit(3)``), ``exit3_hook`` (the same with
``global_except_hook.add_hook()``), ``raise`` (an uncaught exception, no hook), ``raise_hook``
(the same with the hook), ``finalize``
(``comm.finalize()``, then it sleeps), ``recv`` (it returns while rank 0 waits in ``recv`` from
it and the others in ``recv`` from rank 0), ``kill`` (it writes its pid to PID_DIR/pid and waits
for the test's SIGKILL), ``stop`` (it stops itself with SIGSTOP), ``slow`` (rank 0 computes alone
in pure Python for SECONDS while the others wait; every rank finishes),
``normal`` (every rank makes the same calls, on sub-communicators too, and ends: nothing may
be printed), ``staggered`` (the same, rank 0 ending SECONDS after the others).
Prints ``FAULT-LEAVE-AT=<unix time>`` (stderr) when the last rank leaves, and ``job ran to the
end`` when a rank that waited for the leaver got past its call.
"""

import os
import signal
import sys
import time

import numpy

import chainermn_comm


def main(mode, arg=None):
    if mode in ('exit3_hook', 'raise_hook'):
        chainermn_comm.global_except_hook.add_hook()
    comm = chainermn_comm.create_communicator('naive')
    x = numpy.ones(8, numpy.float32)
    for _ in range(3):
        comm.allreduce(x)
    last = comm.rank == comm.size - 1
    if mode == 'normal':  # also a sub-communicator, one dropped unfinalized, one finalized
        sub = comm.split(comm.rank % 2, comm.rank)
        sub.allreduce(x)
        dropped = chainermn_comm.create_communicator('naive')
        dropped.bcast_obj(1)
        del dropped
        done = chainermn_comm.create_communicator('naive')
        done.allreduce(x)
        done.finalize()
        comm.bcast_obj('done')
        return
    if mode == 'staggered':  # every rank ends normally, rank 0 some seconds after the others
        comm.bcast_obj('done')
        if comm.rank == 0:
            time.sleep(float(arg))
        return
    if mode == 'slow':
        if comm.rank == 0:
            deadline = time.monotonic() + float(arg)
            n = 0
            while time.monotonic() < deadline:  # pure Python: holds the GIL but for switches
                n += sum(i * i for i in range(1000)) % 7
        comm.allreduce(x)
        print('job ran to the end (rank {})'.format(comm.rank))
        return
    if last:
        sys.stderr.write('FAULT-LEAVE-AT={:.6f} rank={}\n'.format(time.time(), comm.rank))
        sys.stderr.flush()
        if mode in ('exit3', 'exit3_hook'):
            sys.exit(3)
        if mode in ('raise', 'raise_hook'):
            raise RuntimeError('injected failure on rank {}'.format(comm.rank))
        if mode == 'finalize':
            comm.finalize()
            time.sleep(60)
        if mode == 'kill':
            tmp = os.path.join(arg, 'pid.tmp')
            with open(tmp, 'w') as f:
                f.write(str(os.getpid()))
            os.replace(tmp, os.path.join(arg, 'pid'))
            time.sleep(60)
        if mode == 'stop':
            os.kill(os.getpid(), signal.SIGSTOP)
        return  # 'return', 'recv'
    if mode == 'recv':
        comm.recv(source=comm.size - 1 if comm.rank == 0 else 0, tag=3)
    else:
        comm.allreduce(x)
    print('job ran to the end')


if __name__ == '__main__':
    main(*sys.argv[1:])
