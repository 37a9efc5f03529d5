"""Fault job (run with CHAINERMN_DEBUG=1): ranks make mismatched collective calls."""

import sys
import time

import chainer
import numpy

import chainermn_comm


def main(mode):
    comm = chainermn_comm.create_communicator('naive')
    x = numpy.ones((4, 3), dtype=numpy.float32)
    comm.allreduce(x)  # one matching call first
    sys.stderr.write('FAULT-MISMATCH-AT={:.6f} rank={}\n'.format(time.time(), comm.rank))
    sys.stderr.flush()
    if mode == 'op':
        if comm.rank == 1:
            comm.bcast(x)
        else:
            comm.allreduce(x)
    elif mode == 'shape':
        comm.allreduce(x if comm.rank == 0 else x[:2])
    elif mode == 'dtype':
        comm.allreduce(x if comm.rank == 0 else x.astype(numpy.float64))
    elif mode == 'nograd':
        model = chainer.Chain()
        with model.init_scope():
            model.a = chainer.Parameter(numpy.ones(3, numpy.float32))
            model.b = chainer.Parameter(numpy.ones((2, 2), numpy.float32))
        model.a.grad = numpy.ones(3, numpy.float32)
        if comm.rank == 0:
            model.b.grad = numpy.ones((2, 2), numpy.float32)
        comm.allreduce_grad(model, zero_fill=False)
    elif mode == 'extra':
        for _ in range(3 + (comm.rank == 0)):
            comm.allreduce(x)
        print('rank {} finished its loop'.format(comm.rank))
        return
    else:
        raise ValueError(mode)
    print('job ran past the mismatch')


if __name__ == '__main__':
    main(sys.argv[1])
