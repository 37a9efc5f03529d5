"""Dataset utilities: ``scatter_dataset`` and ``create_empty_dataset``."""

from chainermn_data._scatter import scatter_dataset

__all__ = ['create_empty_dataset', 'scatter_dataset']


def create_empty_dataset(dataset):
    """Return a list as long as ``dataset`` whose every item is the empty tuple ``()``.

    Use it on ranks whose model takes no input from the dataset (e.g. it starts with
    ``chainermn.functions.recv``), so that their iterators count the same iterations and epochs.
    Chainer's default converter turns a batch of ``()`` into ``()``, so the updater and the
    evaluator call the model with no arguments.  Only the length is read, never the samples.
    """
    if dataset is None:
        raise TypeError('create_empty_dataset needs the data set (only its length is read); got None. '
                        'On a rank that did not load it, pass any sequence of its length, e.g. '
                        '[None] * n with n = comm.bcast_obj(len(train) if comm.rank == 0 else None)')
    try:
        n = len(dataset)
    except TypeError:
        raise TypeError('create_empty_dataset needs a dataset with __len__; got {}'.format(
            type(dataset).__name__))
    return [()] * n
