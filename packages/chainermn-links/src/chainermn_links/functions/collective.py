"""Differentiable collective communication: bcast, gather, scatter, alltoall, allgather.

Every node takes a fresh dummy input that needs a gradient, so every rank takes part in the
backward collective even where its own inputs need no gradient (or it has none, e.g. the
non-root ranks of ``bcast``).  Backward is the adjoint of forward:
bcast <-> sum to root, gather <-> scatter, alltoall <-> alltoall, allgather <-> sum of slices.
"""

import chainer
import numpy
from chainer import function_node
from chainermn_comm.engine import fail_together

from chainermn_links.functions import _util

__all__ = ['bcast', 'gather', 'scatter', 'alltoall', 'allgather',
           'Bcast', 'Gather', 'Scatter', 'AllToAll', 'AllGather']


def _gpu_flag_from_root(comm, xp, root):
    """Tell non-root ranks whether the root's data is on a GPU (so outputs land on the same kind)."""
    return bool(comm.bcast_obj(xp is not numpy if comm.rank == root else None, root=root))


def _output_module(on_gpu):
    if on_gpu:
        cupy = _util.cupy_if_available()
        if cupy is not None:
            return cupy
    return numpy


def _fail(comm, what, error):
    """Raise ``error`` here, and on the ranks already inside the collective of ``functions.<what>``."""
    fail_together(comm, 'functions.' + what, error)


def _check_root(comm, root, what):
    if isinstance(root, bool) or not isinstance(root, (int, numpy.integer)) or not 0 <= root < comm.size:
        _fail(comm, what, ValueError('rank {}: functions.{} root must be an int in 0..{}; got {!r}'.format(
            comm.rank, what, comm.size - 1, root)))
    return int(root)


def _grad_or_zeros(g, s):
    return _util.zeros_like_spec(s) if g is None else g.array


class Bcast(function_node.FunctionNode):
    """Broadcast the root's input; backward sums every rank's gradient onto the root."""

    def __init__(self, comm, root):
        self.comm = comm
        self.root = root

    def forward(self, inputs):
        comm, root = self.comm, self.root
        if comm.rank == root:
            x = inputs[1]
            xp = chainer.backend.get_array_module(x)
        else:
            x, xp = None, numpy
        on_gpu = _gpu_flag_from_root(comm, xp, root)
        y = comm.bcast(x, root=root)
        y = _util.to_device_of(y, _output_module(on_gpu))
        self._out_spec = _util.spec(y)
        self._dummy_spec = _util.spec(inputs[0])
        return y,

    def backward(self, target_input_indexes, grad_outputs):
        gy = _grad_or_zeros(grad_outputs[0], self._out_spec)
        summed = self.comm.gather(gy, root=self.root)
        gdummy = chainer.Variable(_util.zeros_like_spec(self._dummy_spec))
        if self.comm.rank == self.root:
            gx = _util.to_like(summed.sum(axis=0), gy)
            return gdummy, chainer.Variable(gx)
        return gdummy,


class Gather(function_node.FunctionNode):
    """Gather every rank's input on the root (shapes may differ); backward scatters the gradients back."""

    def __init__(self, comm, root):
        self.comm = comm
        self.root = root

    def forward(self, inputs):
        comm, root = self.comm, self.root
        x = inputs[1]
        self._in_spec = _util.spec(x)
        self._dummy_spec = _util.spec(inputs[0])
        # A gather that allows a different shape per rank: alltoall with empty pieces
        # (the communicator's own gather needs one shape on every rank).
        empty = x.reshape(-1)[:0]
        got = comm.alltoall([x if r == root else empty for r in range(comm.size)])
        if comm.rank == root:
            outs = tuple(_util.to_device_of(y, self._in_spec[2]) for y in got)
            self._out_specs = [_util.spec(y) for y in outs]
            return outs
        return _util.delegate_array(self._in_spec[2], x.dtype),

    def backward(self, target_input_indexes, grad_outputs):
        comm = self.comm
        if comm.rank == self.root:
            gys = [_grad_or_zeros(g, s) for g, s in zip(grad_outputs, self._out_specs)]
            gx = comm.scatter(gys, root=self.root)
        else:
            gx = comm.scatter(None, root=self.root)
        shape, dtype, xp = self._in_spec
        gx = _util.to_device_of(gx, xp).astype(dtype, copy=False).reshape(shape)
        return (chainer.Variable(_util.zeros_like_spec(self._dummy_spec)), chainer.Variable(gx))


class Scatter(function_node.FunctionNode):
    """Scatter the root's inputs (one per rank); backward gathers the gradients on the root."""

    def __init__(self, comm, root):
        self.comm = comm
        self.root = root

    def forward(self, inputs):
        comm, root = self.comm, self.root
        self._dummy_spec = _util.spec(inputs[0])
        xs = inputs[1:]
        if comm.rank == root:
            self._in_specs = [_util.spec(x) for x in xs]
            xp = chainer.backend.get_array_module(*xs)
        else:
            xs, xp = None, numpy
        on_gpu = _gpu_flag_from_root(comm, xp, root)
        y = comm.scatter(xs, root=root)
        y = _util.to_device_of(y, _output_module(on_gpu))
        self._out_spec = _util.spec(y)
        return y,

    def backward(self, target_input_indexes, grad_outputs):
        comm = self.comm
        gy = _grad_or_zeros(grad_outputs[0], self._out_spec)
        # A gather that allows a different shape per rank: alltoall with empty pieces.
        empty = gy.reshape(-1)[:0]
        pieces = [gy if r == self.root else empty for r in range(comm.size)]
        got = comm.alltoall(pieces)
        gdummy = chainer.Variable(_util.zeros_like_spec(self._dummy_spec))
        if comm.rank != self.root:
            return gdummy,
        gxs = tuple(chainer.Variable(_util.to_device_of(g, xp).astype(dtype, copy=False).reshape(shape))
                    for g, (shape, dtype, xp) in zip(got, self._in_specs))
        return (gdummy,) + gxs


class AllToAll(function_node.FunctionNode):
    """Send input ``i`` to rank ``i``; backward is the same exchange of the gradients."""

    def __init__(self, comm):
        self.comm = comm

    def forward(self, inputs):
        self._dummy_spec = _util.spec(inputs[0])
        xs = inputs[1:]
        self._in_specs = [_util.spec(x) for x in xs]
        xp = chainer.backend.get_array_module(*xs)
        ys = tuple(_util.to_device_of(y, xp) for y in self.comm.alltoall(xs))
        self._out_specs = [_util.spec(y) for y in ys]
        return ys

    def backward(self, target_input_indexes, grad_outputs):
        gys = [_grad_or_zeros(g, s) for g, s in zip(grad_outputs, self._out_specs)]
        got = self.comm.alltoall(gys)
        gxs = tuple(chainer.Variable(_util.to_device_of(g, xp).astype(dtype, copy=False))
                    for g, (shape, dtype, xp) in zip(got, self._in_specs))
        return (chainer.Variable(_util.zeros_like_spec(self._dummy_spec)),) + gxs


class AllGather(function_node.FunctionNode):
    """Give every rank every rank's input; backward sums, for each rank, the gradients of its slice."""

    def __init__(self, comm):
        self.comm = comm

    def forward(self, inputs):
        self._dummy_spec = _util.spec(inputs[0])
        x = inputs[1]
        self._in_spec = _util.spec(x)
        ys = tuple(_util.to_device_of(y, self._in_spec[2]) for y in self.comm.allgather(x))
        self._out_specs = [_util.spec(y) for y in ys]
        return ys

    def backward(self, target_input_indexes, grad_outputs):
        gys = [_grad_or_zeros(g, s) for g, s in zip(grad_outputs, self._out_specs)]
        got = self.comm.alltoall(gys)
        shape, dtype, xp = self._in_spec
        total = got[0].copy()
        for g in got[1:]:
            total += g
        gx = _util.to_device_of(total, xp).astype(dtype, copy=False)
        return chainer.Variable(_util.zeros_like_spec(self._dummy_spec)), chainer.Variable(gx)


def bcast(comm, x, root=0):
    """Broadcast ``x`` from ``root``; backward sums every rank's gradient into the root's ``x``.

    On non-root ranks ``x`` is ignored (pass None).  The result is on a GPU when the root's
    ``x`` is (the current CUDA device).
    """
    root = _check_root(comm, root, 'bcast')
    inputs = (_util.dummy_variable(),)
    if comm.rank == root:
        if x is None:
            _fail(comm, 'bcast', TypeError(
                'rank {}: functions.bcast needs a variable on the root; got None'.format(comm.rank)))
        inputs += _util.as_variable_tuple(x, 'functions.bcast')[:1]
    y, = Bcast(comm, root).apply(inputs)
    return y


def gather(comm, x, root=0):
    """Gather ``x`` of every rank on ``root``; backward scatters the gradients back.

    Returns on the root a tuple of ``comm.size`` variables (item ``i`` from rank ``i``, with that
    rank's shape: shapes may differ per rank).  On other ranks it returns a delegate variable (no
    data): call ``backward()`` on it or connect it with :func:`pseudo_connect` so that the
    backward scatter takes place.
    """
    root = _check_root(comm, root, 'gather')
    xv = _util.as_variable_tuple(x, 'functions.gather')
    if len(xv) != 1:
        _fail(comm, 'gather', TypeError(
            'rank {}: functions.gather takes one variable per rank; got {}'.format(comm.rank, len(xv))))
    ys = Gather(comm, root).apply((_util.dummy_variable(),) + xv)
    if comm.rank == root:
        return tuple(ys)
    return ys[0]


def scatter(comm, xs, root=0):
    """Scatter ``xs[i]`` from ``root`` to rank ``i``; backward gathers the gradients on the root.

    ``xs`` (``comm.size`` variables, shapes may differ) is used on the root only; pass None
    elsewhere.  The result is on a GPU when the root's ``xs`` are.
    """
    root = _check_root(comm, root, 'scatter')
    inputs = (_util.dummy_variable(),)
    if comm.rank == root:
        if not isinstance(xs, (tuple, list)) or len(xs) != comm.size:
            _fail(comm, 'scatter', ValueError(
                'rank {}: functions.scatter needs a tuple/list of {} variables on the root; got {}'.format(
                    comm.rank, comm.size, len(xs) if isinstance(xs, (tuple, list)) else type(xs).__name__)))
        inputs += _util.as_variable_tuple(xs, 'functions.scatter')
    y, = Scatter(comm, root).apply(inputs)
    return y


def alltoall(comm, xs):
    """Send ``xs[i]`` to rank ``i``; return what every rank sent here; backward exchanges gradients."""
    if not isinstance(xs, (tuple, list)) or len(xs) != comm.size:
        _fail(comm, 'alltoall', ValueError(
            'rank {}: functions.alltoall needs a tuple/list of {} variables (one per rank); got {}'.format(
                comm.rank, comm.size, len(xs) if isinstance(xs, (tuple, list)) else type(xs).__name__)))
    xv = _util.as_variable_tuple(xs, 'functions.alltoall')
    return tuple(AllToAll(comm).apply((_util.dummy_variable(),) + xv))


def allgather(comm, x):
    """Return a tuple with ``x`` of every rank; backward sums each rank's slice gradients."""
    xv = _util.as_variable_tuple(x, 'functions.allgather')
    if len(xv) != 1:
        _fail(comm, 'allgather', TypeError(
            'rank {}: functions.allgather takes one variable per rank; got {}'.format(comm.rank, len(xv))))
    return tuple(AllGather(comm).apply((_util.dummy_variable(),) + xv))
