"""Synchronized iterator: every rank keeps its own data but all ranks shuffle in the same order."""

import numpy
from chainer.iterators import ShuffleOrderSampler
from chainermn_comm import voice

from chainermn_data._comm import LOAD_ON_ROOT, describe, guarded, mpi_comm_of
from chainermn_data.iterators._errors import IteratorMismatchError

__all__ = ['create_synchronized_iterator']


def _describe_iterator(it):
    """Return (problem, facts) for an iterator: facts every rank must agree on."""
    if it is None or not hasattr(it, '__next__'):
        return 'needs an iterator (e.g. SerialIterator); got {}'.format(describe(it)), None
    if getattr(it, 'dataset', 0) is None:
        return ('the {} iterates over dataset=None: every rank iterates over its own data set here '
                '(the same length on every rank). If only rank 0 loaded it: {}'.format(
                    describe(it), LOAD_ON_ROOT)), None
    if not hasattr(it, 'order_sampler'):
        return ('cannot synchronize a {}: it has no order_sampler (use SerialIterator, '
                'MultiprocessIterator or MultithreadIterator)'.format(describe(it))), None
    loop = getattr(it, '_prefetch_loop', None)
    if loop is not None and getattr(loop, 'thread', None) is not None:
        return ('the {} has already started prefetching; call create_synchronized_iterator before '
                'drawing any batch'.format(describe(it))), None
    sampler = it.order_sampler
    if sampler is None:
        shuffle = 'none'
    elif isinstance(sampler, ShuffleOrderSampler):
        shuffle = 'shuffle'
    else:
        shuffle = 'custom:' + type(sampler).__name__
    dataset = getattr(it, 'dataset', None)
    length = len(dataset) if dataset is not None else None
    return None, (('length', length), ('batch_size', getattr(it, 'batch_size', None)),
                  ('repeat', getattr(it, 'repeat', None)), ('order', shuffle))


def create_synchronized_iterator(actual_iterator, communicator):
    """Make every rank's ``actual_iterator`` shuffle its own dataset in the same order; return it.

    Collective.  Rank 0 draws a seed and every rank's ``ShuffleOrderSampler`` is replaced by one
    seeded with it, then the iterator is reset; no batch is ever sent.  All ranks must have datasets
    of the same length, the same batch size, ``repeat`` and kind of order (checked: ValueError on
    every rank otherwise).  Custom order samplers are kept as they are and must be deterministic.
    """
    mpi = mpi_comm_of(communicator)
    rank = mpi.Get_rank()
    problem, facts = _describe_iterator(actual_iterator)
    seed = int(numpy.random.randint(0, 2 ** 31 - 1)) if rank == 0 else None
    with guarded(communicator, 'create_synchronized_iterator'):
        everyone = mpi.allgather(('create_synchronized_iterator', problem, facts, seed))
    if any(e[0] != 'create_synchronized_iterator' for e in everyone):
        raise voice.agreed(IteratorMismatchError('rank {}: ranks disagree: {}'.format(
            rank, '; '.join('rank {}: {}'.format(r, e[0]) for r, e in enumerate(everyone)))), mpi)
    bad = [(r, e[1]) for r, e in enumerate(everyone) if e[1] is not None]
    if bad:
        raise voice.agreed(ValueError('rank {}: create_synchronized_iterator: {}'.format(
            rank, '; '.join('rank {}: {}'.format(r, p) for r, p in bad))), mpi)
    if any(e[2] != everyone[0][2] for e in everyone):
        raise voice.agreed(ValueError(
            'rank {}: create_synchronized_iterator needs the same dataset length, batch_size, repeat and '
            'shuffling on every rank; got {}'.format(rank, '; '.join(
                'rank {}: {}'.format(r, ', '.join('{}={}'.format(k, v) for k, v in e[2]))
                for r, e in enumerate(everyone)))), mpi)
    if dict(facts)['order'] == 'shuffle':
        sampler = ShuffleOrderSampler(numpy.random.RandomState(everyone[0][3]))
        actual_iterator.order_sampler = sampler
        loop = getattr(actual_iterator, '_prefetch_loop', None)  # MultiprocessIterator keeps a copy
        if loop is not None and hasattr(loop, 'order_sampler'):
            loop.order_sampler = sampler
        actual_iterator.reset()
    return actual_iterator
