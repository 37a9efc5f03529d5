"""v7's function-level pieces of multi-node batch normalization, for Chainer's own ``BatchNormalization``.

``get_communication_backend(comm, communication_backend='auto')`` resolves ``'auto'`` to ``'nccl'``
or ``'mpi'`` (the rule of :class:`chainermn_links.links.MultiNodeBatchNormalization`), and
``MultiNodeBNImplSelector(comm, backend)`` is an ``impl_selector`` for
``chainer.functions.normalization.batch_normalization.BatchNormalization``: its implementation
averages the batch statistics (forward) and the gradient sums (backward) over all ranks, as v7's.
Collective in training mode: every rank normalizes the same channels together.
"""

from chainer.functions.normalization import batch_normalization as _chainer_bn

from chainermn_links.links.batch_normalization import _allreduce, select_backend

__all__ = ['get_communication_backend', 'MultiNodeBNImplSelector']


def get_communication_backend(comm, communication_backend='auto'):
    """Return ``'nccl'`` or ``'mpi'`` for ``comm``; ValueError for an unknown or unusable backend."""
    return select_backend(comm, communication_backend)


class _MultiNodeImpl(_chainer_bn.GeneralBatchNormalizationImpl):
    """Chainer's batch normalization with the statistics averaged over the ranks of ``comm``."""

    def __init__(self, comm, backend):
        self.comm = comm
        self.backend = backend

    def _mean_over_ranks(self, xp, first, second, gamma):
        both = xp.concatenate([first.ravel(), second.ravel()]).astype(gamma.dtype, copy=False)
        both = _allreduce(self.comm, self.backend, both, gamma) / self.comm.size
        return both[:gamma.size], both[gamma.size:]

    def get_mean_and_var(self, axis, gamma, x, xp, interm_dtype):
        mean, sqmean = self._mean_over_ranks(
            xp, x.mean(axis=axis, dtype=gamma.dtype), xp.square(x).mean(axis=axis, dtype=gamma.dtype), gamma)
        return mean, sqmean - xp.square(mean)

    def get_ggamma_and_gbeta(self, axis, gamma, gy, x_hat, xp):
        gbeta, ggamma = self._mean_over_ranks(
            xp, gy.sum(axis=axis, dtype=gamma.dtype), (gy * x_hat).sum(axis=axis, dtype=gamma.dtype), gamma)
        return gbeta, ggamma


class MultiNodeBNImplSelector:
    """``impl_selector`` of Chainer's ``BatchNormalization`` that averages over the ranks of ``comm``."""

    def __init__(self, comm, communication_backend_name):
        self.comm = comm
        self.communication_backend_name = select_backend(comm, communication_backend_name)

    def __call__(self, batch_norm_func, inputs):
        return _MultiNodeImpl(self.comm, self.communication_backend_name)
