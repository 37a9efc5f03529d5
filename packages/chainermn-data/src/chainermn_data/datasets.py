"""Dataset utilities: ``scatter_dataset`` and ``create_empty_dataset``."""

from chainer.datasets import TransformDataset

from chainermn_data._scatter import scatter_dataset

__all__ = ['create_empty_dataset', 'scatter_dataset']


def create_empty_dataset(dataset):
    """Return a ``TransformDataset`` as long as ``dataset`` whose every sample is ``None``.

    Use it on ranks whose model takes no input from the dataset (e.g. it starts with
    ``chainermn.functions.recv``), so their iterators still count the same iterations and
    epochs.  The original samples are never read: the result only keeps the length.
    """
    try:
        n = len(dataset)
    except TypeError:
        raise TypeError('create_empty_dataset needs a dataset with __len__; got {}'.format(
            type(dataset).__name__))
    return TransformDataset(range(n), _to_none)


def _to_none(_):
    """Drop a sample (module-level so that the dataset pickles for ``scatter_dataset``)."""
    return None
