"""create_mnbn_model: copy a model with every BatchNormalization made multi-node."""

import copy

import chainer
import numpy

from chainermn_links.links.batch_normalization import MultiNodeBatchNormalization

__all__ = ['create_mnbn_model']


def _convert(bn, comm, communication_backend):
    if getattr(bn, 'axis', None) is not None:
        raise ValueError('create_mnbn_model cannot convert BatchNormalization(axis={}); only the '
                         'default channel layout (axis=None) is supported'.format(bn.axis))
    size = tuple(bn.avg_mean.shape)
    use_gamma = isinstance(getattr(bn, 'gamma', None), chainer.Parameter)
    use_beta = isinstance(getattr(bn, 'beta', None), chainer.Parameter)
    new = MultiNodeBatchNormalization(size, comm, decay=bn.decay, eps=bn.eps,
                                      dtype=numpy.dtype(bn.avg_mean.dtype), use_gamma=use_gamma,
                                      use_beta=use_beta, communication_backend=communication_backend)
    new.to_device(bn.device)
    new.avg_mean[...] = bn.avg_mean
    new.avg_var[...] = bn.avg_var
    new.N = bn.N
    if use_gamma and bn.gamma.array is not None:
        new.gamma.array[...] = bn.gamma.array
    if use_beta and bn.beta.array is not None:
        new.beta.array[...] = bn.beta.array
    new.name = bn.name
    return new


def _replace_children(link, comm, backend):
    if isinstance(link, chainer.ChainList):
        for i, child in enumerate(list(link._children)):
            if isinstance(child, chainer.links.BatchNormalization):
                link._children[i] = _convert(child, comm, backend)
            else:
                _replace_children(child, comm, backend)
    elif isinstance(link, chainer.Chain):
        for name in list(link._children):
            child = getattr(link, name)
            if isinstance(child, chainer.links.BatchNormalization):
                new = _convert(child, comm, backend)
                delattr(link, name)
                with link.init_scope():
                    setattr(link, name, new)
            else:
                _replace_children(child, comm, backend)


def create_mnbn_model(link, comm, communication_backend='auto'):
    """Return a deep copy of ``link`` with every ``chainer.links.BatchNormalization`` replaced.

    Each one becomes a :class:`MultiNodeBatchNormalization` with the same size, decay, eps,
    dtype, gamma/beta use, parameters and running statistics.  The original is not modified.
    """
    if isinstance(link, chainer.links.BatchNormalization):
        return _convert(copy.deepcopy(link), comm, communication_backend)
    new = copy.deepcopy(link)
    _replace_children(new, comm, communication_backend)
    return new
