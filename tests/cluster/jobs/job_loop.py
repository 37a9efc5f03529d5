"""Cluster job: data-parallel training that runs until killed; each rank marks iteration 20 in a file.

usage: job_loop.py DIR [SECONDS]

Writes DIR/ready.<rank> at iteration 20 so a test can break something mid-training, and prints
``job ran to the end`` if nothing stopped it within SECONDS (default 120).
"""

import os
import sys
import time

import chainer
import chainer.functions as F
import chainer.links as L
import numpy

import chainermn_comm
import chainermn_train


def main(out_dir, seconds=120.0):
    comm = chainermn_comm.create_communicator('naive')
    model = L.Classifier(chainer.Sequential(L.Linear(64, 256), F.relu, L.Linear(256, 10)))
    optimizer = chainermn_train.create_multi_node_optimizer(chainer.optimizers.SGD(lr=0.01), comm)
    optimizer.setup(model)
    rng = numpy.random.RandomState(comm.rank)
    deadline = time.monotonic() + seconds
    it = 0
    while time.monotonic() < deadline:
        x = rng.randn(32, 64).astype(numpy.float32)
        t = rng.randint(0, 10, size=32).astype(numpy.int32)
        optimizer.update(model, x, t)
        it += 1
        if it == 20:
            path = os.path.join(out_dir, 'ready.{}'.format(comm.rank))
            with open(path + '.tmp', 'w') as f:
                f.write('{} {}\n'.format(os.getpid(), time.time()))
            os.replace(path + '.tmp', path)
    print('job ran to the end: nothing stopped it (rank {}, {} iterations)'.format(comm.rank, it))


if __name__ == '__main__':
    main(sys.argv[1], *[float(a) for a in sys.argv[2:]])
