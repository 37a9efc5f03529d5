"""Fault job (issue 55): the last rank ends with ``raise SystemExit(3)`` or the builtin ``exit(3)``.

Usage: job_system_exit.py raise|builtin|builtin_in_function|raise_in_function [hook]

Module-level code, as a short script is written: after three all-reduces the last rank ends
while the others make one more all-reduce.  ``hook``: the global except hook is installed.
"""

import sys
import time

import numpy

import chainermn_comm

MODE = sys.argv[1]
if sys.argv[2:] == ['hook']:
    chainermn_comm.global_except_hook.add_hook()
comm = chainermn_comm.create_communicator('naive')
x = numpy.ones(8, numpy.float32)
for _ in range(3):
    comm.allreduce(x)


def leave():
    exit(3)


def leave_by_raising():
    raise SystemExit(3)


if comm.rank == comm.size - 1:
    sys.stderr.write('FAULT-LEAVE-AT={:.6f} rank={}\n'.format(time.time(), comm.rank))
    sys.stderr.flush()
    if MODE == 'raise':
        raise SystemExit(3)
    if MODE == 'builtin':
        exit(3)
    if MODE == 'raise_in_function':
        leave_by_raising()
    leave()
comm.allreduce(x)
print('job ran to the end')
