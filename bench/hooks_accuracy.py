"""Accuracy of PowerSGD against exact averaging: validation accuracy per epoch, same seeds.

Run on every rank: ``mpiexec -n N python bench/hooks_accuracy.py --out FILE.json``.  Trains, for
each model (the Quick start's MLP on scikit-learn's bundled 8x8 digits; a small CNN on the same
digits upscaled to 28x28), each averaging (exact; PowerSGD of each ``--ranks`` with error
feedback) and each seed, the same model from the same initial weights on the same shards in
the same order; every rank evaluates the whole validation set after each epoch.  Rank 0 writes
per run the accuracy after each epoch, the updates PowerSGD compressed (all but the first
``--start``) and a hash of the final weights (equal final accuracies of two hooks are equal
counts of right answers on 297 images, not equal models, when the hashes differ).  ``bench/hooks_plot.py`` draws the curves.
"""

import argparse
import hashlib
import json
import time

import chainer
import chainer.functions as F
import chainer.links as L
import numpy

import chainermn


class MLP(chainer.Chain):
    """The Quick start's MLP (README.md): two hidden layers of 1000 units."""

    def __init__(self, n_units=1000, n_out=10):
        super().__init__()
        with self.init_scope():
            self.l1 = L.Linear(64, n_units)
            self.l2 = L.Linear(n_units, n_units)
            self.l3 = L.Linear(n_units, n_out)

    def forward(self, x):
        return self.l3(F.relu(self.l2(F.relu(self.l1(x.reshape(len(x), -1))))))


class CNN(chainer.Chain):
    """Two 3x3 convolutions with max pooling and two linear layers, for 28x28 images."""

    def __init__(self):
        super().__init__()
        with self.init_scope():
            self.c1 = L.Convolution2D(1, 8, 3, pad=1)
            self.c2 = L.Convolution2D(8, 16, 3, pad=1)
            self.l1 = L.Linear(16 * 7 * 7, 64)
            self.l2 = L.Linear(64, 10)

    def forward(self, x):
        h = F.max_pooling_2d(F.relu(self.c1(x)), 2)
        h = F.max_pooling_2d(F.relu(self.c2(h)), 2)
        return self.l2(F.relu(self.l1(h)))


def digits(image):
    """Return (train, validation) of the bundled digits: 1500 / 297 as in the Quick start.

    ``image``: 1x28x28 images (the 8x8 images upscaled by bilinear interpolation), else the flat
    8x8 values.
    """
    from sklearn.datasets import load_digits
    x, y = load_digits(return_X_y=True)
    x = (x / 16).astype(numpy.float32)
    if image:
        up = _bilinear(8, 28)
        x = numpy.einsum('ij,njk,lk->nil', up, x.reshape(-1, 8, 8), up).astype(numpy.float32)
        x = x.reshape(-1, 1, 28, 28)
    data = chainer.datasets.TupleDataset(x, y.astype(numpy.int32))
    return chainer.datasets.split_dataset_random(data, 1500, seed=0)


def _bilinear(n_in, n_out):
    """Return the ``n_out x n_in`` matrix of linear interpolation (corners aligned)."""
    pos = numpy.linspace(0, n_in - 1, n_out)
    lo = numpy.minimum(numpy.floor(pos).astype(int), n_in - 2)
    frac = pos - lo
    out = numpy.zeros((n_out, n_in))
    out[numpy.arange(n_out), lo] = 1 - frac
    out[numpy.arange(n_out), lo + 1] = frac
    return out


class CountingPowerSGD(chainermn.hooks.PowerSGD):
    """PowerSGD that counts the updates it compressed (the proof that the run was compressed)."""

    compressed_updates = 0

    def __call__(self, comm, bucket):
        super().__call__(comm, bucket)
        if bucket.first and self.last.get('compressed'):
            self.compressed_updates += 1


def make_hook(name, start):
    if name == 'exact':
        return None
    rank = int(name.split('-r')[1])
    return CountingPowerSGD(rank=rank, start_update=start)


def digest(model):
    """Return a short hash of the model's parameters (runs that differ at all differ here)."""
    h = hashlib.sha256()
    for name, p in sorted(model.namedparams()):
        h.update(name.encode() + numpy.ascontiguousarray(p.array).tobytes())
    return h.hexdigest()[:12]


def run(comm, model_name, hook_name, seed, epochs, batch, start):
    """Train one model; return (accuracy after each epoch, seconds, updates, compressed updates, digest)."""
    train, val = digits(model_name == 'cnn') if comm.rank == 0 else (None, None)
    train = chainermn.scatter_dataset(train, comm, shuffle=True, seed=seed)
    val = comm.bcast_obj(val)
    vx, vt = chainer.dataset.concat_examples(val)
    numpy.random.seed(seed)
    model = L.Classifier(MLP() if model_name == 'mlp' else CNN())
    base = chainer.optimizers.Adam()  # the Quick start's optimizer, for both models
    hook = make_hook(hook_name, start)
    opt = chainermn.create_multi_node_optimizer(base, comm, comm_hook=hook)
    opt.setup(model)
    sampler = chainer.iterators.ShuffleOrderSampler(numpy.random.RandomState(1000 * seed + comm.rank))
    it = chainer.iterators.SerialIterator(train, batch, order_sampler=sampler)
    accuracy = []
    t0 = time.perf_counter()
    while it.epoch < epochs:
        x, t = chainer.dataset.concat_examples(it.next())
        opt.update(model, x, t)
        if it.is_new_epoch:
            with chainer.using_config('train', False), chainer.no_backprop_mode():
                accuracy.append(float(F.accuracy(model.predictor(vx), vt).array))
    compressed = hook.compressed_updates if hook is not None else 0
    return accuracy, time.perf_counter() - t0, opt.t, compressed, digest(model)


def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--models', default='mlp,cnn')
    p.add_argument('--ranks', default='2,4', help='PowerSGD ranks to compare with exact averaging')
    p.add_argument('--seeds', type=int, default=3)
    p.add_argument('--epochs', type=int, default=8)
    p.add_argument('--batch', type=int, default=None, help='per rank (default: 100 / ranks, min 16)')
    p.add_argument('--start', type=int, default=10, help="PowerSGD's start_update")
    p.add_argument('--out', required=True)
    args = p.parse_args()
    chainermn.global_except_hook.add_hook()
    comm = chainermn.create_communicator('naive')
    batch = args.batch or max(16, 100 // comm.size)  # the same global batch at every rank count
    hooks = ['exact'] + ['powersgd-r{}'.format(r) for r in args.ranks.split(',') if r]
    runs = []
    for model_name in args.models.split(','):
        for seed in range(args.seeds):
            for hook_name in hooks:  # interleaved: the machine's load falls on every variant alike
                acc, seconds, updates, compressed, weights = run(
                    comm, model_name, hook_name, seed, args.epochs, batch, args.start)
                runs.append({'model': model_name, 'hook': hook_name, 'seed': seed, 'accuracy': acc,
                             'seconds': seconds, 'updates': int(updates),
                             'compressed_updates': int(compressed), 'weights': weights})
                if comm.rank == 0:
                    print('{} {} seed {}: final {:.4f} ({} updates, {} compressed, weights {}, '
                          '{:.1f} s)'.format(model_name, hook_name, seed, acc[-1], updates, compressed,
                                             weights, seconds), flush=True)
    if comm.rank == 0:
        meta = {'ranks': comm.size, 'batch_per_rank': batch, 'epochs': args.epochs,
                'start_update': args.start, 'seeds': args.seeds}
        with open(args.out, 'w') as f:
            json.dump({'meta': meta, 'runs': runs}, f, indent=1)


if __name__ == '__main__':
    main()
