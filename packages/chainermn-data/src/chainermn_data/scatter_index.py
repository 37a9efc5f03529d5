"""v7's index-only scatter and its epoch helpers: ``scatter_index``, ``DataSizeError`` and the two
deprecated ``get_n_iterations_for_one_epoch`` / ``get_epoch_trigger``."""

import warnings

__all__ = ['DataSizeError', 'scatter_index', 'get_n_iterations_for_one_epoch', 'get_epoch_trigger']


class DataSizeError(RuntimeError):
    """A data set too large to scatter (v7's name, kept for code that catches it)."""


def _bounds(n, size, rank, force_equal_length):
    """Return v7's ``(begin, end)`` of ``rank``'s part of ``n`` samples (a pure function)."""
    if force_equal_length:
        begin = n * rank // size
        return begin, begin + -(-n // size)
    stride, longer = divmod(n, size)
    begin = rank * stride + min(rank, longer)
    return begin, begin + stride + (1 if rank < longer else 0)


def scatter_index(n_total_samples, comm, root=0, *, force_equal_length=True):
    """Return this rank's ``(begin, end)`` of ``root``'s ``n_total_samples`` (end excluded); collective.

    ``force_equal_length`` (default): every rank gets ``ceil(n / size)`` indices, so parts may
    overlap; otherwise the parts do not overlap and their lengths differ by at most one. Use them
    as ``chainer.datasets.SubDataset(dataset, begin, end, order)``, as v7's ``scatter_dataset`` does.
    """
    n = comm.bcast_obj(n_total_samples if comm.rank == root else None, root=root)
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError('rank {}: scatter_index needs a non-negative int number of samples on root {}; '
                         'got {!r}'.format(comm.rank, root, n))
    return _bounds(n, comm.size, comm.rank, force_equal_length)


def get_n_iterations_for_one_epoch(dataset, local_batch_size, comm):
    """Return rank 0's iterations per epoch, ``ceil(len(dataset) / local_batch_size)``, on every rank.

    Deprecated (as in v7): use Chainer's epoch triggers. Collective.
    """
    warnings.warn('get_n_iterations_for_one_epoch is deprecated; use epoch triggers, e.g. '
                  "(n, 'epoch')", DeprecationWarning, stacklevel=2)
    n = -(-len(dataset) // local_batch_size) if comm.rank == 0 else None
    return comm.bcast_obj(n, root=0)


def get_epoch_trigger(n_epochs, dataset, local_batch_size, comm):
    """Return ``(n_epochs * iterations per epoch, 'iteration')``; deprecated (as in v7). Collective."""
    warnings.warn("get_epoch_trigger is deprecated; use (n_epochs, 'epoch')", DeprecationWarning,
                  stacklevel=2)
    with warnings.catch_warnings():
        warnings.simplefilter('ignore', DeprecationWarning)
        per_epoch = get_n_iterations_for_one_epoch(dataset, local_batch_size, comm)
    return n_epochs * per_epoch, 'iteration'
