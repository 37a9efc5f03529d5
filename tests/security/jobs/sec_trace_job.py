"""Root job of the security suite (run under mpiexec): CHAINERMN_TRACE values and planted trace names.

- ``bad OUT VALUE...``: for each VALUE, set CHAINERMN_TRACE and create a communicator (it must be
  refused on every rank, naming the variable); then, unset, a communicator works.
- ``trace``: a short traced job (CHAINERMN_TRACE comes from the environment).

``bad`` appends one JSON line per value to ``OUT.<rank>``.
"""

import json
import os
import sys

import numpy

import chainermn_comm


def bad(out, *values):
    rank = None
    for value in values:
        os.environ['CHAINERMN_TRACE'] = value
        try:
            chainermn_comm.create_communicator('naive')
            error = None
        except Exception as e:
            error = [type(e).__name__, str(e)]
        os.environ.pop('CHAINERMN_TRACE')
        comm = chainermn_comm.create_communicator('naive')
        rank = comm.rank
        with open('{}.{}'.format(out, rank), 'a') as f:
            f.write(json.dumps({'value': value, 'error': error, 'rank': rank,
                                'works_unset': comm.allreduce_obj(1) == comm.size}) + '\n')


def trace():
    comm = chainermn_comm.create_communicator('naive')
    for i in range(3):
        comm.allreduce(numpy.full(4, float(i)))


if __name__ == '__main__':
    {'bad': bad, 'trace': trace}[sys.argv[1]](*sys.argv[2:])
