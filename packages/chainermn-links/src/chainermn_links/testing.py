"""Test helpers: a numeric gradient check across ranks, and v7's ``get_device``."""

import chainer
import chainer.functions as F
import numpy

__all__ = ['check_backward_across_ranks', 'get_device']


def _as_tuple(y):
    if y is None:
        return ()
    return tuple(y) if isinstance(y, (tuple, list)) else (y,)


def check_backward_across_ranks(comm, func, inputs, seed=0, eps=1e-5, atol=1e-6, rtol=1e-5):
    """Compare backward of ``func`` with central differences of a loss summed over all ranks.

    ``func(*variables)`` runs on every rank with this rank's ``inputs`` (float64 arrays; may
    differ per rank, may be empty).  The loss is ``sum over ranks and outputs of sum(y * gy)``
    with fixed random ``gy``.  Every element of every rank's inputs is perturbed in turn
    (all ranks run the same number of forward calls); each rank asserts on its own inputs.
    Returns this rank's analytic gradients.
    """
    rng = numpy.random.RandomState(seed + 1000 * comm.rank)
    xs = [chainer.Variable(numpy.array(x, copy=True)) for x in inputs]
    ys = _as_tuple(func(*xs))
    gys = [rng.uniform(-1, 1, y.shape).astype(y.dtype) for y in ys]
    terms = [F.sum(y * gy) for y, gy in zip(ys, gys)]
    if terms:
        loss = terms[0]
        for t in terms[1:]:
            loss = loss + t
        loss.backward()
    analytic = [numpy.zeros_like(x.array) if x.grad is None else chainer.backends.cuda.to_cpu(x.grad)
                for x in xs]

    def total_loss(arrays):
        with chainer.no_backprop_mode():
            outs = _as_tuple(func(*[chainer.Variable(a) for a in arrays]))
            local = float(sum(float((chainer.backends.cuda.to_cpu(y.array) * gy).sum())
                              for y, gy in zip(outs, gys)))
        return comm.allreduce_obj(local)

    sizes = comm.allgather_obj([numpy.asarray(x).size for x in inputs])
    for p in range(comm.size):
        for k, n in enumerate(sizes[p]):
            for i in range(n):
                values = []
                for sign in (1, -1):
                    arrays = [numpy.array(x, copy=True) for x in inputs]
                    if comm.rank == p:
                        arrays[k].reshape(-1)[i] += sign * eps
                    values.append(total_loss(arrays))
                if comm.rank == p:
                    numeric = (values[0] - values[1]) / (2 * eps)
                    got = analytic[k].reshape(-1)[i]
                    assert abs(got - numeric) <= atol + rtol * abs(numeric), (
                        'rank {}: gradient of input {} element {}: backward gave {!r}, numeric {!r}'.format(
                            comm.rank, k, i, got, numeric))
    return analytic


def get_device(device_id=None, use_chainerx=False):
    """Return the Chainer device a test runs on (v7's ``chainermn.testing.get_device``).

    ``device_id`` None: NumPy (ChainerX's ``native:0`` with ``use_chainerx``); an int: that GPU
    through CuPy (ChainerX's ``cuda:N``).
    """
    if device_id is None:
        return chainer.get_device('native:0' if use_chainerx else '@numpy')
    return chainer.get_device(('cuda:{}' if use_chainerx else '@cupy:{}').format(int(device_id)))
