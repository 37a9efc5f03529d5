#!/usr/bin/env python
"""Model-parallel MLP on scikit-learn's bundled digits, split over 2 processes.

    mpiexec -n 2 python examples/model_parallel/train_model_parallel.py --epoch 3

Rank 0 holds the first and last layers (it reads the data and computes the loss), rank 1
holds the middle layer.  Activations travel 0 -> 1 -> 0 in forward and gradients 0 -> 1 -> 0
in backward through ``MultiNodeChainList``.  Both ranks walk through the same batches built
from a shared seed (rank 1 only needs their count).
"""

import argparse
import sys

import chainer
import chainer.functions as F
import chainer.links as L
import numpy

import chainermn
from chainermn import MultiNodeChainList


class Layer(chainer.Chain):
    """One linear layer followed by ReLU (or nothing for the output layer)."""

    def __init__(self, n_in, n_out, activation=True):
        super().__init__()
        self.activation = activation
        with self.init_scope():
            self.l = L.Linear(n_in, n_out)

    def forward(self, x):
        h = self.l(x)
        return F.relu(h) if self.activation else h


class Model0(MultiNodeChainList):
    """Rank 0: input layer (sent to rank 1) and output layer (received from rank 1)."""

    def __init__(self, comm, n_in, n_units, n_out):
        super().__init__(comm)
        self.add_link(Layer(n_in, n_units), rank_in=None, rank_out=1)
        self.add_link(Layer(n_units, n_out, activation=False), rank_in=1, rank_out=None)


class Model1(MultiNodeChainList):
    """Rank 1: the hidden layer, receiving from and sending back to rank 0."""

    def __init__(self, comm, n_units):
        super().__init__(comm)
        self.add_link(Layer(n_units, n_units), rank_in=0, rank_out=0)


def load_data(seed, n_train=None):
    from sklearn.datasets import load_digits
    digits = load_digits()
    x = (digits.data / 16.0).astype(numpy.float32)
    t = digits.target.astype(numpy.int32)
    perm = numpy.random.RandomState(seed).permutation(len(x))
    x, t = x[perm], t[perm]
    n_test = len(x) // 5
    test = (x[:n_test], t[:n_test])
    train = (x[n_test:], t[n_test:])
    if n_train:
        train = (train[0][:n_train], train[1][:n_train])
    return train, test


def main(argv=None):
    parser = argparse.ArgumentParser(description='ChainerMN model-parallel example (digits)')
    parser.add_argument('--epoch', '-e', type=int, default=10)
    parser.add_argument('--batchsize', '-b', type=int, default=64)
    parser.add_argument('--unit', '-u', type=int, default=100)
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--n-train', type=int, default=None, help='use only this many training examples')
    parser.add_argument('--communicator', default='naive')
    args = parser.parse_args(argv)

    comm = chainermn.create_communicator(args.communicator)
    if comm.size != 2:
        if comm.rank == 0:
            sys.stderr.write('This example needs exactly 2 processes: mpiexec -n 2 python {}\n'.format(
                sys.argv[0]))
        return 2

    (x_train, t_train), (x_test, t_test) = load_data(args.seed, args.n_train)
    numpy.random.seed(args.seed + comm.rank)
    if comm.rank == 0:
        model = Model0(comm, x_train.shape[1], args.unit, 10)
    else:
        model = Model1(comm, args.unit)
    optimizer = chainer.optimizers.Adam()
    optimizer.setup(model)

    rng = numpy.random.RandomState(args.seed)         # same on both ranks: same batches
    n = len(x_train)
    for epoch in range(1, args.epoch + 1):
        order = rng.permutation(n)
        total_loss, total_correct = 0.0, 0
        for start in range(0, n, args.batchsize):
            idx = order[start:start + args.batchsize]
            model.cleargrads()
            if comm.rank == 0:
                y = model(x_train[idx])
                loss = F.softmax_cross_entropy(y, t_train[idx])
                loss.backward()
                total_loss += float(loss.array) * len(idx)
                total_correct += int((y.array.argmax(axis=1) == t_train[idx]).sum())
            else:
                model().backward()
            optimizer.update()

        with chainer.using_config('train', False), chainer.no_backprop_mode():
            if comm.rank == 0:
                y = model(x_test)
                test_loss = float(F.softmax_cross_entropy(y, t_test).array)
                test_acc = float((y.array.argmax(axis=1) == t_test).mean())
            else:
                model()
        if comm.rank == 0:
            print('epoch {} main/loss {:.4f} main/accuracy {:.4f} validation/main/loss {:.4f} '
                  'validation/main/accuracy {:.4f}'.format(epoch, total_loss / n, total_correct / n,
                                                           test_loss, test_acc), flush=True)
    return 0


if __name__ == '__main__':
    sys.exit(main())
