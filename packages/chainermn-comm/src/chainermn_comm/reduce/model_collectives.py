"""The communicator methods on a model's parameters: broadcast the weights, average the gradients."""

import contextlib

import numpy

from chainermn_comm import _arrays, _finalize
from chainermn_comm.averaging import Averaging, ModelAverage, arrays_traced
from chainermn_comm.reduce import chunked as _grad
from chainermn_comm import trace

__all__ = ['ModelCollectives', 'arrays_traced']


class ModelCollectives:
    """``bcast_data`` and ``multi_node_mean_grad`` over host memory, for :class:`MpiCommunicatorBase`.

    Uses the communicator's ``_guard``, ``_reducer``, ``_rank`` and ``_averaging`` (its
    :class:`chainermn_comm.averaging.Averaging`).
    """

    @property
    def guard(self):
        """The call guard of this communicator (agreement check, watchdog, trace): comm's internal API."""
        return self._guard

    @property
    def averaging(self):
        """The averaging interface of this communicator (``chainermn_comm.averaging``): comm's internal API."""
        return self._averaging

    def _device_averaging(self):
        """Return what the averaging interface needs from a device path (GPU communicators override)."""
        return {}

    def _make_averaging(self, base_class):
        """Return this communicator's averaging interface (after ``_guard`` and ``_reducer`` exist)."""
        return Averaging(self, self._guard, self._reducer, base_class, hold_hook=self._hook_scope,
                         **self._device_averaging())

    @contextlib.contextmanager
    def _hook_scope(self, hook):
        """While a communication hook runs, make this communicator's own collectives raise a clear error."""
        guard = self._guard
        self._guard = self._averaging.guard = _finalize.HookGuard(guard, hook, self._rank)
        try:
            yield
        finally:
            self._guard = self._averaging.guard = guard

    def bcast_data(self, model):
        named = [(n, p) for n, p in sorted(model.namedparams(), key=lambda kv: kv[0]) if p.array is not None]
        params = [p for _, p in named]
        sig = (('params', tuple((n, p.array.shape, p.array.dtype.str) for n, p in named)),)
        traced = arrays_traced([p.array for p in params], 'bcast') if trace.ON else None
        with self._guard('bcast_data', sig, key=_grad.params_key(params, 'array'), traced=traced):
            self._bcast_params(params)

    def _bcast_params(self, params):
        arrays = [self._param_host(p, 'array', 'bcast_data') for p in params]
        self._reducer.bcast([a for a, _ in arrays], root=0)
        for p, (a, on_device) in zip(params, arrays):
            if on_device:
                p.array[...] = _arrays.like(a, p.array)
            elif a is not p.array:
                p.array[...] = a

    def multi_node_mean_grad(self, model, zero_fill=True):
        """Average the parameter gradients of a Chainer link over all processes, in place.

        The built-in strategy of :class:`chainermn_comm.averaging.ModelAverage` (exact, or the
        communicator's ``allreduce_grad_dtype`` on the wire), under the checked call.
        """
        ModelAverage(self, model, builtin=True).mean(zero_fill)

    def allreduce_grad(self, model, zero_fill=True):
        """Deprecated alias of :meth:`multi_node_mean_grad` (Chainer v7's older name)."""
        return self.multi_node_mean_grad(model, zero_fill=zero_fill)

    def _wire_tuned(self, wire):
        """Whether the average of ``wire`` finished its first schedule (``averaging.wire_tuned``; tests read it)."""
        return self._averaging.wire_tuned(wire)

    @property
    def _tuned(self):
        """The tuner of the communicator's own wire (``averaging.own_tuned()``; tests read it)."""
        return self._averaging.own_tuned()

    def _param_host(self, param, attr, what):
        """Return (contiguous host array for ``param.<attr>``, whether it was staged from a GPU)."""
        arr = getattr(param, attr)
        if isinstance(arr, numpy.ndarray):
            if not arr.flags.c_contiguous:
                arr = arr.copy(order='C')  # keeps 0-d shapes, unlike ascontiguousarray
                setattr(param, attr, arr)
            return arr, False
        _arrays.check_current_device(arr, what, self._rank)
        return _arrays.as_host(arr), True
