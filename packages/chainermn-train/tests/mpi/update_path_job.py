"""Measure the chainermn functions one steady-state update enters (run under mpiexec).

A 3-layer MLP, default settings, 60 updates first (the tuner settles), then one
``optimizer.update(lossfun, x, t)`` under ``sys.setprofile``.  Each rank prints
``PATH rank R: F functions, C calls, N files`` and, with a file name as argv[1], rank 0
writes the listing there.
"""

import sys
import warnings

import chainer
import chainer.functions as F
import chainer.links as L
import numpy

import chainermn_comm
import chainermn_train
from chainermn_comm.testing.call_path import measure


class MLP3(chainer.Chain):
    def __init__(self):
        super().__init__()
        with self.init_scope():
            self.l1 = L.Linear(32, 64)
            self.l2 = L.Linear(64, 64)
            self.l3 = L.Linear(64, 10)

    def forward(self, x):
        return self.l3(F.relu(self.l2(F.relu(self.l1(x)))))


def main():
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        comm = chainermn_comm.create_communicator()
    numpy.random.seed(comm.rank)
    model = MLP3()
    opt = chainermn_train.create_multi_node_optimizer(chainer.optimizers.SGD(lr=0.01), comm)
    opt.setup(model)
    rs = numpy.random.RandomState(comm.rank)
    x = rs.standard_normal((16, 32)).astype(numpy.float32)
    t = rs.randint(0, 10, 16).astype(numpy.int32)

    def lossfun(x, t):
        return F.softmax_cross_entropy(model(x), t)

    for _ in range(60):
        opt.update(lossfun, x, t)
    _, path = measure(opt.update, lossfun, x, t)
    print('PATH rank {}: {} functions, {} calls, {} files'.format(
        comm.rank, len(path.functions), path.calls, len(path.files)), flush=True)
    if comm.rank == 0 and len(sys.argv) > 1:
        with open(sys.argv[1], 'w') as f:
            f.write(path.listing() + '\n')
    comm.finalize()


if __name__ == '__main__':
    main()
