#!/usr/bin/env python
"""Data-parallel ImageNet-style training with ChainerMN: a small ResNet on a shipped image set.

Run:  mpiexec -n 2 python examples/imagenet/train_imagenet.py            # CPU
      mpiexec -n 2 python examples/imagenet/train_imagenet.py --tiny     # a few iterations (CI)
      mpiexec -n 4 python examples/imagenet/train_imagenet.py --gpu

What it shows (the parts of the original ImageNet example that matter for ChainerMN):
- ``MultiprocessIterator`` with ``multiprocessing.set_start_method('forkserver')`` and one
  process started *before* the communicator, so MPI is never initialised in a forked child;
- a custom evaluator (a subclass of ``extensions.Evaluator`` running in test mode) made
  multi-node by ``chainermn.create_multi_node_evaluator``;
- ``chainermn.extensions.AllreducePersistent`` averaging BatchNormalization statistics;
- ``chainermn.create_multi_node_checkpointer`` with ``maybe_load`` to resume an interrupted run.

Data: scikit-learn's bundled 8x8 digits, upscaled to 3x32x32 "images" (no download), with
random-crop / flip augmentation done in the iterator's worker processes.  Rank 0 prints
``FINAL validation/main/accuracy=...`` at the end.
"""

import argparse
import multiprocessing
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


class BottleNeck(chainer.Chain):
    """Residual block: conv-BN-ReLU-conv-BN plus a (projected) shortcut."""

    def __init__(self, in_ch, out_ch, stride=1):
        super(BottleNeck, self).__init__()
        w = chainer.initializers.HeNormal()
        with self.init_scope():
            self.conv1 = L.Convolution2D(in_ch, out_ch, 3, stride, 1, initialW=w, nobias=True)
            self.bn1 = L.BatchNormalization(out_ch)
            self.conv2 = L.Convolution2D(out_ch, out_ch, 3, 1, 1, initialW=w, nobias=True)
            self.bn2 = L.BatchNormalization(out_ch)
            if stride != 1 or in_ch != out_ch:
                self.proj = L.Convolution2D(in_ch, out_ch, 1, stride, 0, initialW=w, nobias=True)
                self.bn_proj = L.BatchNormalization(out_ch)
            else:
                self.proj = None

    def forward(self, x):
        h = F.relu(self.bn1(self.conv1(x)))
        h = self.bn2(self.conv2(h))
        shortcut = x if self.proj is None else self.bn_proj(self.proj(x))
        return F.relu(h + shortcut)


class SmallResNet(chainer.Chain):
    """A ResNet-style network for 3x{insize}x{insize} inputs: stem + 3 stages + global pooling."""

    insize = 28

    def __init__(self, n_class=10, width=16):
        super(SmallResNet, self).__init__()
        with self.init_scope():
            self.conv1 = L.Convolution2D(3, width, 3, 1, 1, nobias=True,
                                         initialW=chainer.initializers.HeNormal())
            self.bn1 = L.BatchNormalization(width)
            self.res2 = BottleNeck(width, width)
            self.res3 = BottleNeck(width, width * 2, stride=2)
            self.res4 = BottleNeck(width * 2, width * 4, stride=2)
            self.fc = L.Linear(width * 4, n_class)

    def forward(self, x):
        h = F.relu(self.bn1(self.conv1(x)))
        h = self.res4(self.res3(self.res2(h)))
        h = F.average(h, axis=(2, 3))
        return self.fc(h)


class PreprocessedDataset(chainer.dataset.DatasetMixin):
    """Digits upscaled to 3x32x32, random 28x28 crop + flip when training, center crop otherwise."""

    def __init__(self, images, labels, crop_size, random):
        self.images = images
        self.labels = labels
        self.crop_size = crop_size
        self.random = random

    def __len__(self):
        return len(self.images)

    def get_example(self, i):
        image = self.images[i]
        _, h, w = image.shape
        size = self.crop_size
        if self.random:
            top = numpy.random.randint(0, h - size + 1)
            left = numpy.random.randint(0, w - size + 1)
        else:
            top, left = (h - size) // 2, (w - size) // 2
        image = image[:, top:top + size, left:left + size]
        if self.random and numpy.random.randint(2):
            image = image[:, :, ::-1]
        return numpy.ascontiguousarray(image), self.labels[i]


class TestModeEvaluator(extensions.Evaluator):
    """Evaluator that runs the model in test mode (BatchNormalization uses its running stats)."""

    def evaluate(self):
        with chainer.using_config('train', False):
            return super(TestModeEvaluator, self).evaluate()


def load_images(test_fraction=0.2, seed=0):
    """Return (train_x, train_y, test_x, test_y): scikit-learn digits as 3x32x32 float32 images."""
    from sklearn.datasets import load_digits
    digits = load_digits()
    x = (digits.images / 16.0).astype(numpy.float32)               # (N, 8, 8)
    x = x.repeat(4, axis=1).repeat(4, axis=2)                      # (N, 32, 32)
    x = numpy.repeat(x[:, None], 3, axis=1)                        # (N, 3, 32, 32)
    x -= x.mean(axis=(0, 2, 3), keepdims=True)
    y = digits.target.astype(numpy.int32)
    order = numpy.random.RandomState(seed).permutation(len(x))
    n_test = int(len(x) * test_fraction)
    return x[order[n_test:]], y[order[n_test:]], x[order[:n_test]], y[order[:n_test]]


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description='ChainerMN example: ResNet-style data parallel')
    parser.add_argument('--batchsize', '-B', type=int, default=32, help='mini-batch size per rank')
    parser.add_argument('--communicator', default=None,
                        help='communicator name (default: hierarchical, or naive on CPU)')
    parser.add_argument('--epoch', '-E', type=int, default=5, help='number of epochs to train')
    parser.add_argument('--iterations', type=int, default=None,
                        help='stop after this many iterations instead of --epoch')
    parser.add_argument('--gpu', '-g', action='store_true', help='use GPU (one per rank)')
    parser.add_argument('--loaderjob', '-j', type=int, default=2,
                        help='number of parallel data loading processes per rank')
    parser.add_argument('--out', '-o', default='result_imagenet', help='output directory')
    parser.add_argument('--run-id', default='imagenet_example',
                        help='name of the run; checkpoints are <run-id>.<rank>.<iteration>')
    parser.add_argument('--tiny', action='store_true',
                        help='CI settings: 6 iterations, batch 8, 1 loader process')
    parser.add_argument('--no-progress', action='store_true', help='no progress bar')
    args = parser.parse_args(argv)
    if args.tiny:
        args.iterations, args.batchsize, args.loaderjob = 6, 8, 1
    return args


def main(argv=None):
    args = parse_args(argv)
    # MultiprocessIterator workers must not be fork()ed from a process that initialised MPI
    # (InfiniBand and some MPIs break).  Use forkserver and start it now, before the communicator,
    # so the fork server itself is forked from a process without MPI.
    multiprocessing.set_start_method('forkserver')
    p = multiprocessing.Process()
    p.start()
    p.join()

    chainermn.global_except_hook.add_hook()
    comm = chainermn.create_communicator(args.communicator)   # None: the default
    device = comm.intra_rank if args.gpu else -1
    if device >= 0:
        chainer.cuda.get_device_from_id(device).use()

    if comm.rank == 0:
        print('==========================================')
        print('Num process (COMM_WORLD): {}'.format(comm.size))
        print('Using {} communicator on {}'.format(type(comm).__name__, 'GPUs' if args.gpu else 'CPU'))
        print('Num Minibatch-size: {}'.format(args.batchsize))
        print('==========================================', flush=True)

    model = L.Classifier(SmallResNet())
    if device >= 0:
        model.to_gpu()

    # Rank 0 builds the data set; every rank gets its share (here the arrays themselves; with real
    # ImageNet only file paths would be scattered and each rank would read its own files).
    if comm.rank == 0:
        train_x, train_y, test_x, test_y = load_images()
        train = PreprocessedDataset(train_x, train_y, SmallResNet.insize, random=True)
        test = PreprocessedDataset(test_x, test_y, SmallResNet.insize, random=False)
    else:
        train = test = None
    train = chainermn.scatter_dataset(train, comm, shuffle=True, seed=0)
    test = chainermn.scatter_dataset(test, comm)

    train_iter = chainer.iterators.MultiprocessIterator(
        train, args.batchsize, n_processes=args.loaderjob)
    test_iter = chainer.iterators.MultiprocessIterator(
        test, args.batchsize, repeat=False, shuffle=False, n_processes=args.loaderjob)

    optimizer = chainermn.create_multi_node_optimizer(
        chainer.optimizers.MomentumSGD(lr=0.05, momentum=0.9), comm)
    optimizer.setup(model)
    optimizer.add_hook(chainer.optimizer_hooks.WeightDecay(1e-4))

    stop = (args.iterations, 'iteration') if args.iterations else (args.epoch, 'epoch')
    log_interval = (1, 'iteration') if args.iterations else (1, 'epoch')
    updater = training.StandardUpdater(train_iter, optimizer, device=device)
    trainer = training.Trainer(updater, stop, out=args.out)

    # Average BatchNormalization's running statistics over ranks before each evaluation.
    trainer.extend(chainermn.extensions.AllreducePersistent(model, comm), trigger=log_interval)
    evaluator = TestModeEvaluator(test_iter, model, device=device)
    evaluator = chainermn.create_multi_node_evaluator(evaluator, comm)
    trainer.extend(evaluator, trigger=stop if args.iterations else log_interval)

    # Generational snapshots on every rank; resume from the newest iteration all ranks have.
    os.makedirs(args.out, exist_ok=True)
    checkpointer = chainermn.create_multi_node_checkpointer(name=args.run_id, comm=comm,
                                                            path=args.out)
    checkpointer.maybe_load(trainer, optimizer)
    trainer.extend(checkpointer, trigger=(max(1, (args.iterations or 50) // 2), 'iteration'))

    if comm.rank == 0:
        trainer.extend(extensions.LogReport(trigger=log_interval))
        trainer.extend(extensions.PrintReport(
            ['epoch', 'iteration', 'main/loss', 'validation/main/loss', 'main/accuracy',
             'validation/main/accuracy', 'elapsed_time']), trigger=log_interval)
        if not args.no_progress:
            trainer.extend(extensions.ProgressBar(update_interval=1))

    start = time.time()
    resumed = trainer.updater.iteration
    trainer.run()

    if comm.rank == 0:
        log = [e for e in trainer.get_extension('LogReport').log if 'validation/main/accuracy' in e]
        last = log[-1] if log else {}
        print('FINAL validation/main/accuracy={:.4f} validation/main/loss={:.4f} iterations={} '
              'resumed_from={} ranks={} seconds={:.1f}'.format(
                  float(last.get('validation/main/accuracy', float('nan'))),
                  float(last.get('validation/main/loss', float('nan'))),
                  trainer.updater.iteration, resumed, comm.size, time.time() - start), flush=True)
    return 0


if __name__ == '__main__':
    sys.exit(main())
