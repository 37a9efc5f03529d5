"""Cluster job: count the bytes on this node's link (eth0) and loopback around one multi_node_mean_grad.

usage: job_bytes.py OUT_DIR ELEMENTS    (float32 gradient of ELEMENTS elements; writes OUT_DIR/bytes.<rank>.json)
"""

import json
import os
import sys

import chainer
import numpy

import chainermn_comm


def counters():
    out = {}
    for iface in ('eth0', 'lo'):
        for key in ('tx_bytes', 'rx_bytes'):
            with open('/sys/class/net/{}/statistics/{}'.format(iface, key)) as f:
                out['{}.{}'.format(iface, key)] = int(f.read())
    return out


def main(out_dir, n):
    comm = chainermn_comm.create_communicator('naive')
    model = chainer.Link()
    with model.init_scope():
        model.w = chainer.Parameter(numpy.zeros(n, numpy.float32))
    for _ in range(2):              # the first call sets up buffers and connections
        model.w.grad = numpy.full(n, comm.rank + 1, numpy.float32)
        comm.mpi_comm.Barrier()
        before = counters()
        comm.mpi_comm.Barrier()
        comm.multi_node_mean_grad(model)
        comm.mpi_comm.Barrier()
        after = counters()
    want = (comm.size + 1) / 2.0        # mean of 1..size
    assert numpy.all(model.w.grad == want), (model.w.grad[:4], want)
    delta = {k: after[k] - before[k] for k in before}
    with open(os.path.join(out_dir, 'bytes.{}.json'.format(comm.rank)), 'w') as f:
        json.dump(dict(delta, rank=comm.rank, node=comm.inter_rank, intra_rank=comm.intra_rank,
                       grad_bytes=4 * n), f)


if __name__ == '__main__':
    main(sys.argv[1], int(sys.argv[2]))
