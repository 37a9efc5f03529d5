#!/usr/bin/env python
"""A user's model-parallel MLP over 2 ranks (issue 21), written the way ChainerMN scripts are.

Rank 0 holds ``L.Classifier`` of a chain that sends its first layer's output to rank 1 and
receives rank 1's result; rank 1 holds the lazily initialised middle layers and trains on
``create_empty_dataset``.  Plain Chainer trainer: ``SerialIterator``, ``StandardUpdater`` with
the default converter, multi-node optimizer and evaluator (on the ranks holding the same part).
Rank 0 prints ``FINAL validation/main/accuracy=...``.
"""

import argparse
import os
import sys

import chainer
import chainer.links as L
import numpy
from chainer import training
from chainer.training import extensions

import chainermn

# The two parts of the model and the data set, as in the example (same layers, same split).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..', 'examples',
                                'model_parallel'))
from train_data_model_parallel import Back, Front, load_digits  # noqa: E402


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument('--epoch', type=int, default=2)
    parser.add_argument('--batchsize', type=int, default=32)
    parser.add_argument('--unit', type=int, default=1000)
    parser.add_argument('--seed', type=int, default=0)
    args = parser.parse_args(argv)

    comm = chainermn.create_communicator('naive')
    assert comm.size == 2, 'run with mpiexec -n 2'
    numpy.random.seed(args.seed + comm.rank)
    train, test = load_digits()
    if comm.rank == 0:
        model = L.Classifier(Front(comm, 64, args.unit))
    else:
        model = Back(comm, args.unit, 10)
        train = chainermn.datasets.create_empty_dataset(train)
        test = chainermn.datasets.create_empty_dataset(test)

    # The two ranks hold different parts, so there is nothing to average between them: the
    # multi-node optimizer works on a communicator of the ranks that hold this same part (here
    # only this rank).  On `comm` itself it would average unrelated parameters (ChainerMN v7
    # fails there too, in bcast_data at the first update).
    part_comm = comm.split(comm.rank, 0)
    optimizer = chainermn.create_multi_node_optimizer(chainer.optimizers.Adam(), part_comm)
    optimizer.setup(model)

    train_iter = chainer.iterators.SerialIterator(train, args.batchsize, shuffle=False)
    test_iter = chainer.iterators.SerialIterator(test, args.batchsize, repeat=False, shuffle=False)
    updater = training.StandardUpdater(train_iter, optimizer)
    trainer = training.Trainer(updater, (args.epoch, 'epoch'), out='result')
    evaluator = extensions.Evaluator(test_iter, model)
    evaluator = chainermn.create_multi_node_evaluator(evaluator, part_comm)
    trainer.extend(evaluator)
    if comm.rank == 0:
        trainer.extend(extensions.LogReport())
        trainer.extend(extensions.PrintReport(['epoch', 'main/loss', 'validation/main/loss',
                                               'main/accuracy', 'validation/main/accuracy']))
    trainer.run()
    if comm.rank == 0:
        obs = trainer.observation
        print('FINAL validation/main/accuracy={:.4f} validation/main/loss={:.4f}'.format(
            float(obs['validation/main/accuracy']), float(obs['validation/main/loss'])), flush=True)
    return 0


if __name__ == '__main__':
    sys.exit(main())
