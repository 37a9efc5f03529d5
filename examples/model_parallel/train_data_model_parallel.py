#!/usr/bin/env python
"""Data parallel on top of model parallel: an MLP split over rank pairs, the pairs averaged.

    mpiexec -n 4 python examples/model_parallel/train_data_model_parallel.py

Ranks form a grid: ``data_axis, model_axis = rank % 2, rank // 2``.  The two ranks of a model
axis (``model_comm``) hold the two parts of one model: the front part (input layer and loss)
sends its hidden activations to the back part, which returns the class scores.  The ranks that
hold the same part (``data_comm``) train on different shards of the data set and average their
gradients with ``create_multi_node_optimizer``.  The back part reads nothing from the data set:
it trains on ``create_empty_dataset`` (items ``()``, so the default converter calls it with no
arguments) of the same length, so both parts count the same iterations.  The back part's layers
are initialised lazily; its first update only broadcasts them (see the chainermn-train README).

Any even number of processes works (2: one pair, no data parallelism).  The data set is
scikit-learn's bundled 8x8 digits (no download).  Rank 0 prints
``FINAL validation/main/accuracy=...``.
"""

import argparse
import sys

import chainer
import chainer.functions as F
import chainer.links as L
import numpy
from chainer import training
from chainer.training import extensions

import chainermn


class Identity(chainer.Chain):
    """Pass the received class scores on to the loss."""

    def forward(self, x):
        return x


class Front(chainermn.MultiNodeChainList):
    """Input layer, sent to the partner; then what the partner sends back."""

    def __init__(self, model_comm, n_in, n_units):
        super().__init__(comm=model_comm)
        self.add_link(L.Linear(n_in, n_units), rank_in=None, rank_out=1)
        self.add_link(Identity(), rank_in=1, rank_out=None)


class Hidden(chainer.Chain):
    """Hidden and output layers, sized at their first call."""

    def __init__(self, n_units, n_out):
        super().__init__()
        with self.init_scope():
            self.l1 = L.Linear(None, n_units)
            self.l2 = L.Linear(None, n_out)

    def forward(self, h):
        return self.l2(F.relu(self.l1(F.relu(h))))


class Back(chainermn.MultiNodeChainList):
    """Receive the partner's activations, return class scores to it."""

    def __init__(self, model_comm, n_units, n_out):
        super().__init__(comm=model_comm)
        self.add_link(Hidden(n_units, n_out), rank_in=0, rank_out=0)


def load_digits(test_fraction=0.2, seed=0):
    """Return (train, test) TupleDatasets of scikit-learn's 8x8 digits scaled to [0, 1]."""
    from sklearn.datasets import load_digits as sk_load_digits
    digits = sk_load_digits()
    x = (digits.data / 16.0).astype(numpy.float32)
    t = digits.target.astype(numpy.int32)
    order = numpy.random.RandomState(seed).permutation(len(x))
    n_test = int(len(x) * test_fraction)
    return (chainer.datasets.TupleDataset(x[order[n_test:]], t[order[n_test:]]),
            chainer.datasets.TupleDataset(x[order[:n_test]], t[order[:n_test]]))


def main(argv=None):
    parser = argparse.ArgumentParser(description='ChainerMN example: data + model parallel MLP')
    parser.add_argument('--batchsize', '-b', type=int, default=32, help='examples per batch and rank')
    parser.add_argument('--epoch', '-e', type=int, default=5, help='sweeps over the data set')
    parser.add_argument('--unit', '-u', type=int, default=1000, help='hidden units')
    parser.add_argument('--communicator', default='naive', help='communicator name')
    parser.add_argument('--seed', type=int, default=None,
                        help='seed of the initial weights and of the shuffles (default: unseeded)')
    parser.add_argument('--no-progress', action='store_true', help='print no per-epoch report')
    args = parser.parse_args(argv)

    comm = chainermn.create_communicator(args.communicator)
    if comm.size % 2:
        if comm.rank == 0:
            sys.stderr.write('this example needs an even number of processes (a model uses 2); '
                             'got {}\n'.format(comm.size))
        return 2
    data_axis, model_axis = comm.rank % 2, comm.rank // 2
    data_comm = comm.split(data_axis, comm.rank)    # ranks that hold the same part
    model_comm = comm.split(model_axis, comm.rank)  # the two ranks that hold one model
    if args.seed is not None:
        numpy.random.seed(args.seed + comm.rank)

    if model_comm.rank == 0:
        model = L.Classifier(Front(model_comm, 64, args.unit))
    else:
        model = Back(model_comm, args.unit, 10)
    optimizer = chainermn.create_multi_node_optimizer(chainer.optimizers.Adam(), data_comm)
    optimizer.setup(model)

    # The root of each data_comm (model_axis 0) reads the data set and scatters it; the back
    # parts scatter an empty data set of the same length.
    if model_axis == 0:
        train, test = load_digits()
        if data_axis == 1:
            train = chainermn.datasets.create_empty_dataset(train)
            test = chainermn.datasets.create_empty_dataset(test)
    else:
        train, test = None, None
    train = chainermn.scatter_dataset(train, data_comm, shuffle=True, seed=args.seed)
    test = chainermn.scatter_dataset(test, data_comm, shuffle=True, seed=args.seed)

    # No shuffling here: both parts of a model must walk through their shards in step.
    train_iter = chainer.iterators.SerialIterator(train, args.batchsize, shuffle=False)
    test_iter = chainer.iterators.SerialIterator(test, args.batchsize, repeat=False, shuffle=False)
    updater = training.StandardUpdater(train_iter, optimizer)
    trainer = training.Trainer(updater, (args.epoch, 'epoch'), out='result')
    evaluator = extensions.Evaluator(test_iter, model)
    trainer.extend(chainermn.create_multi_node_evaluator(evaluator, data_comm))
    if comm.rank == 0 and not args.no_progress:
        trainer.extend(extensions.LogReport(trigger=(1, 'epoch')))
        trainer.extend(extensions.PrintReport(['epoch', 'main/loss', 'validation/main/loss',
                                               'main/accuracy', 'validation/main/accuracy']))
    trainer.run()
    if comm.rank == 0:
        obs = trainer.observation
        print('FINAL validation/main/accuracy={:.4f} validation/main/loss={:.4f} ranks={} '
              'epochs={}'.format(float(obs['validation/main/accuracy']),
                                 float(obs['validation/main/loss']), comm.size, args.epoch),
              flush=True)
    return 0


if __name__ == '__main__':
    sys.exit(main())
