"""MultiNodeBatchNormalization: batch normalization over the global batch of all ranks."""

import chainer
import chainer.functions as F
import numpy
from chainer import function_node, initializers, variable
from chainermn_comm import CommunicationError
from chainermn_comm.engine import fail_together

from chainermn_links._share_comm import deepcopy_sharing_comm

__all__ = ['MultiNodeBatchNormalization', 'select_backend', 'NCCL_COMMUNICATOR_NAMES']

#: Communicator names whose array collectives run over NCCL.
NCCL_COMMUNICATOR_NAMES = frozenset(
    ['hierarchical', 'two_dimensional', 'single_node', 'pure_nccl', 'non_cuda_aware'])

_BACKENDS = ('auto', 'mpi', 'nccl')


def _uses_nccl(comm):
    flag = getattr(comm, 'uses_nccl', None)
    if flag is not None:
        return bool(flag)
    return getattr(comm, 'name', None) in NCCL_COMMUNICATOR_NAMES


def select_backend(comm, communication_backend):
    """Resolve 'auto'|'mpi'|'nccl' for ``comm``; raise ValueError for 'nccl' on a non-NCCL communicator."""
    if communication_backend not in _BACKENDS:
        raise ValueError("MultiNodeBatchNormalization: communication_backend must be one of {}; got {!r}".format(
            ', '.join(repr(b) for b in _BACKENDS), communication_backend))
    nccl = _uses_nccl(comm)
    if communication_backend == 'auto':
        return 'nccl' if nccl else 'mpi'
    if communication_backend == 'nccl' and not nccl:
        raise ValueError(
            "MultiNodeBatchNormalization: communication_backend='nccl' needs a communicator that uses "
            "NCCL ({}); got {} "
            "(name {!r}). Use communication_backend='mpi' or 'auto', or create a GPU communicator, "
            "e.g. create_communicator('pure_nccl').".format(
                ', '.join(sorted(NCCL_COMMUNICATOR_NAMES)), type(comm).__name__, getattr(comm, 'name', None)))
    return communication_backend


def _allreduce(comm, backend, a, gamma):
    """Sum ``a`` over all ranks: on the device for 'nccl', through host memory for 'mpi'."""
    try:
        if backend == 'nccl':
            return comm.allreduce(a)
        xp = chainer.backend.get_array_module(a)
        host = chainer.backends.cuda.to_cpu(a) if xp is not numpy else a
        out = comm.allreduce(numpy.ascontiguousarray(host))
        return xp.asarray(out) if xp is not numpy else out
    except CommunicationError as e:
        raise CommunicationError(
            'rank {}: MultiNodeBatchNormalization with {} channels (dtype {}): the ranks\' '
            'batch normalizations differ (a different size or dtype on some rank?):\n{}'.format(
                comm.rank, gamma.shape, a.dtype, e)) from e


class MultiNodeBNFunction(function_node.FunctionNode):
    """Batch normalization whose mean, variance and backward sums cover every rank's batch."""

    def __init__(self, comm, eps, backend):
        self.comm = comm
        self.eps = eps
        self.backend = backend

    def forward(self, inputs):
        x, gamma, beta = inputs
        xp = chainer.backend.get_array_module(x)
        nc = gamma.ndim
        self.axes = (0,) + tuple(range(1 + nc, x.ndim))
        self.bshape = (1,) + gamma.shape + (1,) * (x.ndim - 1 - nc)
        cdtype = numpy.promote_types(x.dtype, numpy.float32)
        xc = x.astype(cdtype, copy=False)
        local_count = x.size // max(gamma.size, 1)
        packed = xp.concatenate([xc.sum(axis=self.axes).ravel(),
                                 xp.asarray([local_count], dtype=cdtype)])
        packed = _allreduce(self.comm, self.backend, packed, gamma)
        count = packed[-1].item()
        if count <= 0:
            raise ValueError('rank {}: MultiNodeBatchNormalization got an empty global batch'.format(
                self.comm.rank))
        mean = (packed[:-1] / count).reshape(gamma.shape)
        centered = xc - mean.reshape(self.bshape)
        var = _allreduce(self.comm, self.backend, (centered * centered).sum(axis=self.axes),
                         gamma) / count
        var = var.reshape(gamma.shape)
        inv_std = 1.0 / xp.sqrt(var + self.eps)
        x_hat = centered * inv_std.reshape(self.bshape)
        y = gamma.astype(cdtype).reshape(self.bshape) * x_hat + beta.astype(cdtype).reshape(self.bshape)
        self.count = count
        self.mean = mean
        self.var = var
        self.x_hat = x_hat
        self.inv_std = inv_std
        self.gamma = gamma
        self.dtypes = (x.dtype, gamma.dtype, beta.dtype)
        return y.astype(x.dtype, copy=False),

    def backward(self, target_input_indexes, grad_outputs):
        gy = grad_outputs[0].array
        xp = chainer.backend.get_array_module(gy)
        gyc = gy.astype(self.x_hat.dtype, copy=False)
        gbeta = gyc.sum(axis=self.axes)
        ggamma = (gyc * self.x_hat).sum(axis=self.axes)
        n = gbeta.size
        sums = _allreduce(self.comm, self.backend, xp.concatenate([gbeta.ravel(), ggamma.ravel()]),
                         self.gamma)
        mean_gbeta = (sums[:n] / self.count).reshape(self.bshape)
        mean_ggamma = (sums[n:] / self.count).reshape(self.bshape)
        scale = (self.gamma.astype(gyc.dtype) * self.inv_std).reshape(self.bshape)
        gx = scale * (gyc - mean_gbeta - self.x_hat * mean_ggamma)
        xdt, gdt, bdt = self.dtypes
        shape = self.gamma.shape
        return (chainer.Variable(gx.astype(xdt, copy=False)),
                chainer.Variable(ggamma.reshape(shape).astype(gdt, copy=False)),
                chainer.Variable(gbeta.reshape(shape).astype(bdt, copy=False)))


class MultiNodeBatchNormalization(chainer.Link):
    """Batch normalization layer that uses the statistics of the whole batch over all ranks.

    Forward (in training mode) normalizes with the mean and variance of the concatenation of
    every rank's batch, and backward uses the matching global sums, so the result equals
    :class:`chainer.links.BatchNormalization` applied to the global batch.  Running averages
    (``avg_mean``, ``avg_var``, ``N``) are updated exactly like that link does (unbiased
    variance of the global batch) and stay identical on every rank.  The gradients of
    ``gamma``/``beta`` are this rank's contribution; their sum over ranks is the gradient of
    the global batch (the multi-node optimizer then averages them like any other parameter).

    Args:
        size (int or tuple of ints): size (or shape) of the channel dimensions.
        comm: ChainerMN communicator.
        decay (float): decay rate of the running averages.
        eps (float): epsilon added to the variance.
        dtype: dtype of the parameters and running statistics; ``None`` (the default) takes
            ``chainer.config.dtype``, except that ``mixed16`` gives float32 (the input and
            output are then float16), as in :class:`chainer.links.BatchNormalization`.
        use_gamma (bool): learn a scale; otherwise scale by one.
        use_beta (bool): learn a shift; otherwise shift by zero.
        initial_gamma, initial_beta: initializers (default 1 and 0).
        communication_backend (str): ``'mpi'``, ``'nccl'`` or ``'auto'`` (NCCL for NCCL
            communicators, MPI otherwise).
    """

    def __init__(self, size, comm, decay=0.9, eps=2e-05, dtype=None, use_gamma=True,
                 use_beta=True, initial_gamma=None, initial_beta=None, communication_backend='auto'):
        super().__init__()
        if isinstance(size, (int, numpy.integer)):
            size = (int(size),)
        size = tuple(int(s) for s in size)
        # Under mixed16 the parameters and running statistics stay float32 (as in Chainer's own
        # BatchNormalization and v7's link); the input and output stay float16.
        dtype = numpy.dtype(chainer.get_dtype(dtype, map_mixed16=numpy.float32))
        self.comm = comm
        self.decay = decay
        self.eps = eps
        self.size = size
        self._dtype = dtype
        self.use_gamma = use_gamma
        self.use_beta = use_beta
        self.communication_backend = select_backend(comm, communication_backend)
        self.avg_mean = numpy.zeros(size, dtype=dtype)
        self.register_persistent('avg_mean')
        self.avg_var = numpy.ones(size, dtype=dtype)
        self.register_persistent('avg_var')
        self.N = 0
        self.register_persistent('N')
        with self.init_scope():
            if use_gamma:
                init = initializers._get_initializer(1 if initial_gamma is None else initial_gamma)
                init.dtype = dtype
                self.gamma = variable.Parameter(init, size)
            if use_beta:
                init = initializers._get_initializer(0 if initial_beta is None else initial_beta)
                init.dtype = dtype
                self.beta = variable.Parameter(init, size)

    def __deepcopy__(self, memo):
        return deepcopy_sharing_comm(self, memo)

    def _constant(self, value):
        xp = self.xp
        return chainer.Variable(xp.full(self.size, value, dtype=self._dtype), requires_grad=False)

    def forward(self, x, finetune=False):
        """Normalize ``x`` (shape ``(N,) + size + ...``) with global batch statistics in training mode."""
        gamma = self.gamma if self.use_gamma else self._constant(1)
        beta = self.beta if self.use_beta else self._constant(0)
        xshape = x.shape
        if tuple(xshape[1:1 + len(self.size)]) != self.size:
            error = ValueError('rank {}: MultiNodeBatchNormalization of size {} got input of shape {}; '
                               'axes 1..{} must equal size'.format(
                                   self.comm.rank, self.size, xshape, len(self.size)))
            if chainer.config.train:  # the other ranks are in the statistics' all-reduce
                fail_together(self.comm, 'allreduce', error)
            raise error
        if not chainer.config.train:
            return F.fixed_batch_normalization(x, gamma, beta, self.avg_mean, self.avg_var, self.eps)
        if finetune:
            self.N += 1
            decay = 1.0 - 1.0 / self.N
        else:
            decay = self.decay
        fn = MultiNodeBNFunction(self.comm, self.eps, self.communication_backend)
        y, = fn.apply((x, gamma, beta))
        m = fn.count
        adjust = m / max(m - 1.0, 1.0)
        self.avg_mean *= decay
        self.avg_mean += (1 - decay) * fn.mean.astype(self.avg_mean.dtype, copy=False)
        self.avg_var *= decay
        self.avg_var += (1 - decay) * adjust * fn.var.astype(self.avg_var.dtype, copy=False)
        return y
