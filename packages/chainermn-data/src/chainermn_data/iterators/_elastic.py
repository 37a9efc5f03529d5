"""An iterator that walks one global permutation per epoch, split across the ranks, resizable.

The samples of all epochs form one global stream: epoch ``e`` contributes the permutation
``RandomState([seed, e]).permutation(n)`` of the ``n`` samples (the identity without shuffle).  At
every step the ranks take the next ``comm.size * batch_size`` positions of the stream, rank ``r``
the ``r``-th run of ``batch_size`` of them.  The state is the stream position, the same on every
rank and independent of the world size, so a job resumed on another number of ranks continues at
the same position: every sample of the epoch not yet consumed is consumed exactly once by the new
ranks, and none twice.  Every rank needs the whole dataset (e.g. a list of file names).
"""

import numpy
from chainer.dataset import iterator as iterator_module
from chainermn_comm import voice

from chainermn_data._comm import guarded, mpi_comm_of

__all__ = ['ElasticIterator', 'create_elastic_iterator']


class ElasticIterator(iterator_module.Iterator):
    """Iterator over a global per-epoch permutation shared by the ranks; see the module docstring.

    Attributes:
        last_positions (numpy.ndarray): stream positions of the samples of the last batch (sample
            ``i`` of epoch ``p // n`` for position ``p``), for logging and tests.
    """

    #: The checkpointer keeps this iterator's snapshot state when the world size changes.
    elastic = True

    def __init__(self, dataset, batch_size, rank, size, shuffle, seed, repeat=True):
        self.dataset = dataset
        self.batch_size = int(batch_size)
        self.rank = rank
        self.size = size
        self.shuffle = bool(shuffle)
        self.seed = int(seed)
        self._repeat = bool(repeat)
        self._cached = (None, None)
        self.last_positions = numpy.empty(0, dtype=numpy.int64)
        self.reset()

    def reset(self):
        """Go back to the start of the stream (epoch 0)."""
        self.position = 0
        self.epoch = 0
        self.is_new_epoch = False
        self._previous_epoch_detail = -1.

    @property
    def repeat(self):
        return self._repeat

    def _order(self, epoch):
        if self._cached[0] != epoch:
            n = len(self.dataset)
            order = (numpy.random.RandomState([self.seed, epoch]).permutation(n) if self.shuffle
                     else numpy.arange(n))
            self._cached = (epoch, order)
        return self._cached[1]

    def __next__(self):
        n = len(self.dataset)
        if n == 0 or (not self._repeat and self.position >= n):
            raise StopIteration
        step = self.size * self.batch_size
        positions = self.position + self.rank * self.batch_size + numpy.arange(
            self.batch_size, dtype=numpy.int64)
        if not self._repeat:
            positions = positions[positions < n]
        batch = [self.dataset[int(self._order(int(p // n))[p % n])] for p in positions]
        self._previous_epoch_detail = self.epoch_detail
        self.position += step if self._repeat else min(step, n - self.position)
        epoch = self.position // n
        self.is_new_epoch = epoch > self.epoch
        self.epoch = epoch
        self.last_positions = positions
        return batch

    next = __next__

    @property
    def epoch_detail(self):
        n = len(self.dataset)
        return self.position / n if n else 0.

    @property
    def previous_epoch_detail(self):
        return None if self._previous_epoch_detail < 0 else self._previous_epoch_detail

    def serialize(self, serializer):
        """Save or load the stream position (the same on every rank, for any world size)."""
        n = len(self.dataset)
        saved_n = int(serializer('dataset_length', n))
        if saved_n != n:
            raise ValueError('rank {}: the elastic iterator was saved over {} samples but this one has {}; '
                             'pass the same dataset'.format(self.rank, saved_n, n))
        self.position = int(serializer('position', self.position))
        self.epoch = int(serializer('epoch', self.epoch))
        self.is_new_epoch = bool(serializer('is_new_epoch', self.is_new_epoch))
        self._previous_epoch_detail = float(serializer('previous_epoch_detail',
                                                       self._previous_epoch_detail))
        self.seed = int(serializer('seed', self.seed))
        self.shuffle = bool(serializer('shuffle', self.shuffle))
        self._cached = (None, None)


def create_elastic_iterator(dataset, batch_size, comm, shuffle=True, seed=None, repeat=True):
    """Create an iterator that splits one global permutation per epoch across the ranks of ``comm``.

    Collective.  Every rank passes the whole ``dataset`` (the same length everywhere) and the same
    ``batch_size`` (per rank) and ``shuffle``; ``seed=None`` takes rank 0's random seed.  At each
    step rank ``r`` takes positions ``[r * batch_size, (r + 1) * batch_size)`` of the next
    ``comm.size * batch_size`` samples of the stream.  Its snapshot state does not depend on the
    number of ranks: a job resumed on another number of ranks (the multi-node checkpointer keeps
    the state of iterators with ``elastic = True``) consumes every remaining sample of the epoch
    exactly once.
    """
    mpi = mpi_comm_of(comm)
    rank, size = mpi.Get_rank(), mpi.Get_size()
    problem = None
    try:
        n = len(dataset)
    except TypeError as e:
        n, problem = None, 'the dataset needs __len__ and __getitem__: {}'.format(e)
    if dataset is None:
        problem = ('dataset=None: an elastic iterator splits the whole data set itself, so every rank '
                   'loads it and passes it (do not scatter it with scatter_dataset)')
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, numpy.integer)) or batch_size < 1:
        problem = 'batch_size must be a positive int; got {!r}'.format(batch_size)
    if seed is None and rank == 0:
        seed = int(numpy.random.randint(0, 2 ** 31 - 1))
    mine = (problem, n, batch_size if problem is None else None, bool(shuffle),
            None if seed is None else int(seed))
    with guarded(comm, 'create_elastic_iterator', ()):
        everyone = mpi.allgather(mine)
    bad = ['rank {}: {}'.format(r, e[0]) for r, e in enumerate(everyone) if e[0] is not None]
    if not bad:
        keys = {e[1:4] for e in everyone}
        if len(keys) != 1:
            bad = ['rank {}: {} samples, batch_size {}, shuffle {}'.format(r, *e[1:4])
                   for r, e in enumerate(everyone)]
            bad.insert(0, 'every rank must pass the same dataset length, batch_size and shuffle')
    if bad:
        raise voice.agreed(ValueError('rank {}: create_elastic_iterator got invalid arguments: {}'.format(
            rank, '; '.join(bad))), mpi)
    seeds = {e[4] for e in everyone if e[4] is not None}
    if len(seeds) > 1:
        raise voice.agreed(ValueError(
            'rank {}: create_elastic_iterator needs the same seed on every rank (or None on all but rank '
            '0); got {}'.format(rank, ', '.join('rank {}: {}'.format(r, e[4])
                                                for r, e in enumerate(everyone)))),
            mpi)
    return ElasticIterator(dataset, batch_size, rank, size, shuffle, everyone[0][4], repeat=repeat)
