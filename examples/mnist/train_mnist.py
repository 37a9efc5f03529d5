#!/usr/bin/env python
"""Data-parallel MNIST-style training with ChainerMN (the tutorial's example).

Run:  mpiexec -n 2 python examples/mnist/train_mnist.py            # CPU, 8x8 digits
      mpiexec -n 4 python examples/mnist/train_mnist.py --gpu      # one GPU per rank
      mpiexec -n 2 python examples/mnist/train_mnist.py --dataset mnist   # cached MNIST files
      python -m chainermn launch --hosts-file hosts --ranks-per-node 2 --min-nodes 1 -- \
          python examples/mnist/train_mnist.py --checkpoint /local/disk/ckpt    # elastic, resumable

The default data set is scikit-learn's bundled 8x8 handwritten digits (1,797 images, shipped
inside the package: no download).  Rank 0 prints ``FINAL validation/main/accuracy=...`` at the end.
"""

import argparse
import os
import sys
import time

import chainer
import chainer.functions as F
import chainer.links as L
import numpy
from chainer import training
from chainer.training import extensions

import chainermn


class MLP(chainer.Chain):
    """Three-layer perceptron, as in Chainer's MNIST example."""

    def __init__(self, n_units, n_out):
        super(MLP, self).__init__()
        with self.init_scope():
            self.l1 = L.Linear(None, n_units)
            self.l2 = L.Linear(None, n_units)
            self.l3 = L.Linear(None, n_out)

    def forward(self, x):
        h1 = F.relu(self.l1(x))
        h2 = F.relu(self.l2(h1))
        return self.l3(h2)


def load_digits(test_fraction=0.2, seed=0):
    """Return (train, test) TupleDatasets of scikit-learn's 8x8 digits scaled to [0, 1]."""
    from sklearn.datasets import load_digits as sk_load_digits
    digits = sk_load_digits()
    x = (digits.data / 16.0).astype(numpy.float32)
    y = digits.target.astype(numpy.int32)
    order = numpy.random.RandomState(seed).permutation(len(x))
    n_test = int(len(x) * test_fraction)
    test_idx, train_idx = order[:n_test], order[n_test:]
    return (chainer.datasets.TupleDataset(x[train_idx], y[train_idx]),
            chainer.datasets.TupleDataset(x[test_idx], y[test_idx]))


def load_mnist():
    """Return Chainer's MNIST (train, test) if its files are already cached; never download."""
    root = os.path.join(chainer.dataset.get_dataset_root(), 'pfnet', 'chainer', 'mnist')
    missing = [f for f in ('train.npz', 'test.npz') if not os.path.exists(os.path.join(root, f))]
    if missing:
        raise RuntimeError(
            'MNIST is not cached ({} missing in {}); this example never downloads. Run '
            '`python -c "import chainer; chainer.datasets.get_mnist()"` once on a machine with '
            'network access (set CHAINER_DATASET_ROOT to share the cache), or use the default '
            '--dataset digits.'.format(', '.join(missing), root))
    return chainer.datasets.get_mnist()


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description='ChainerMN example: MNIST-style MLP')
    parser.add_argument('--batchsize', '-b', type=int, default=100,
                        help='number of images in each mini-batch, per rank')
    parser.add_argument('--checkpoint', default=None,
                        help='directory of the snapshots (resume from it; $VARS are expanded)')
    parser.add_argument('--checkpoint-interval', type=int, default=5,
                        help='iterations between two snapshots (default 5)')
    parser.add_argument('--communicator', type=str, default=None,
                        help='communicator name (default: hierarchical, or naive on CPUs)')
    parser.add_argument('--dataset', choices=('digits', 'mnist'), default='digits',
                        help='digits: scikit-learn 8x8 digits (bundled); mnist: cached MNIST files')
    parser.add_argument('--epoch', '-e', type=int, default=10,
                        help='number of sweeps over the dataset to train')
    parser.add_argument('--gpu', '-g', action='store_true', help='use GPU (one per rank)')
    parser.add_argument('--out', '-o', default='result', help='directory to output the result')
    parser.add_argument('--unit', '-u', type=int, default=1000, help='number of units')
    parser.add_argument('--no-progress', action='store_true', help='do not show the progress bar')
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    # An uncaught exception on one rank ends the whole job instead of hanging the others.
    chainermn.global_except_hook.add_hook()

    # Step 1: a communicator (None: hierarchical, or naive on a CPU-only machine) ...
    comm = chainermn.create_communicator(args.communicator)
    device = -1
    if args.gpu:
        device = comm.intra_rank  # one GPU per rank on each node
        chainer.cuda.get_device_from_id(device).use()

    if comm.rank == 0:
        print('==========================================')
        print('Num process (COMM_WORLD): {}'.format(comm.size))
        print('Using {} communicator'.format(type(comm).__name__))
        print('Using {}'.format('GPUs' if args.gpu else 'CPU'))
        print('Dataset: {}'.format(args.dataset))
        print('Num unit: {}'.format(args.unit))
        print('Num Minibatch-size: {}'.format(args.batchsize))
        print('Num epoch: {}'.format(args.epoch))
        print('==========================================', flush=True)

    model = L.Classifier(MLP(args.unit, 10))
    if device >= 0:
        model.to_gpu()

    # ... and a multi-node optimizer, which all-reduces the gradients after backward.
    optimizer = chainermn.create_multi_node_optimizer(chainer.optimizers.Adam(), comm)
    optimizer.setup(model)

    # Step 2: rank 0 loads the data set and scatters equal shares to every rank.
    if comm.rank == 0:
        train, test = load_digits() if args.dataset == 'digits' else load_mnist()
    else:
        train, test = None, None
    train = chainermn.scatter_dataset(train, comm, shuffle=True, seed=0)
    test = chainermn.scatter_dataset(test, comm)

    train_iter = chainer.iterators.SerialIterator(train, args.batchsize)
    test_iter = chainer.iterators.SerialIterator(test, args.batchsize, repeat=False, shuffle=False)

    updater = training.StandardUpdater(train_iter, optimizer, device=device)
    trainer = training.Trainer(updater, (args.epoch, 'epoch'), out=args.out)

    # A multi-node evaluator reports the average over all ranks.
    evaluator = extensions.Evaluator(test_iter, model, device=device)
    evaluator = chainermn.create_multi_node_evaluator(evaluator, comm)
    trainer.extend(evaluator)

    # Reporting extensions only on rank 0, so the output is not repeated.
    if comm.rank == 0:
        trainer.extend(extensions.LogReport())
        trainer.extend(extensions.PrintReport(
            ['epoch', 'main/loss', 'validation/main/loss',
             'main/accuracy', 'validation/main/accuracy', 'elapsed_time']))
        if not args.no_progress:
            trainer.extend(extensions.ProgressBar())

    if args.checkpoint:
        # Resume from the newest usable snapshot, on any number of ranks.
        checkpointer = chainermn.create_multi_node_checkpointer(
            'mnist', comm, path=os.path.expandvars(args.checkpoint))
        trainer.extend(checkpointer, trigger=(args.checkpoint_interval, 'iteration'))
        checkpointer.maybe_load(trainer, optimizer)

    start = time.time()
    trainer.run()

    if comm.rank == 0:
        last = trainer.get_extension('LogReport').log[-1]
        print('FINAL validation/main/accuracy={:.4f} validation/main/loss={:.4f} epochs={} '
              'ranks={} seconds={:.1f}'.format(
                  float(last['validation/main/accuracy']), float(last['validation/main/loss']),
                  args.epoch, comm.size, time.time() - start), flush=True)
    return 0


if __name__ == '__main__':
    sys.exit(main())
