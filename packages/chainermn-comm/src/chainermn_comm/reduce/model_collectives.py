"""The communicator methods on a model's parameters: broadcast the weights, average the gradients."""

import numpy

from chainermn_comm import _arrays
from chainermn_comm.reduce import chunked as _grad
from chainermn_comm import trace
from chainermn_comm.reduce import tune as _tune

__all__ = ['ModelCollectives', 'arrays_traced']


def arrays_traced(arrays, op, wire_dtype=None):
    """Return the trace arguments of a collective over ``arrays`` (``grad`` for averages)."""
    dtypes = {a.dtype for a in arrays}
    args = {'bytes': sum(a.nbytes for a in arrays), 'op': op,
            'dtype': dtypes.pop().name if len(dtypes) == 1 else ('mixed' if dtypes else '')}
    if op == 'mean':
        args['grad'] = True
        if wire_dtype is not None and numpy.dtype(wire_dtype).name != args['dtype']:
            args['wire_dtype'] = numpy.dtype(wire_dtype).name
    return args


def _wire_key(wire):
    """Return a key that tells wires apart (None, the gradients' own dtype, is not float32)."""
    return None if wire is None else _tune.label(wire)


class ModelCollectives:
    """``bcast_data`` and ``allreduce_grad`` over host memory, for :class:`MpiCommunicatorBase`.

    Uses the communicator's ``_guard``, ``_reducer``, ``_rank`` and ``allreduce_grad_dtype``.
    """

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

    def allreduce_grad(self, model, zero_fill=True):
        params = _grad.collect_params(model, zero_fill)

        def sig():
            return (('params', _grad.params_signature(model, params, 'grad')),)

        traced = arrays_traced([p.grad for p in params], 'mean', self.allreduce_grad_dtype) \
            if trace.ON else None
        with self._guard('allreduce_grad', sig, key=_grad.params_key(params, 'grad'), traced=traced):
            self._mean_grads(params)

    def multi_node_mean_grad(self, model, zero_fill=True):
        return self.allreduce_grad(model, zero_fill=zero_fill)

    def _mean_grads(self, params):
        """Average the gradients of ``params`` over all ranks in place (the communicator's own wire)."""
        self._mean_arrays(self._grads_of(params), self.allreduce_grad_dtype)

    def _grads_of(self, params):
        """Return the gradients of ``params``; host ones that are not C-contiguous are replaced by copies."""
        grads = []
        for p in params:
            g = p.grad
            if isinstance(g, numpy.ndarray) and not g.flags.c_contiguous:
                g = p.grad = g.copy(order='C')  # keeps 0-d shapes, unlike ascontiguousarray
            grads.append(g)
        return grads

    def _mean_arrays(self, grads, wire):
        """Average the arrays ``grads`` over all ranks in place, ``wire`` crossing the network.

        ``wire`` is an ``allreduce_grad_dtype`` (None, a float dtype, ``'bfloat16'``, ``'auto'``);
        each wire has its own tuner (``reduce.tune``).  Not guarded: callers hold the guard.
        """
        staged = [self._host_of(g) for g in grads]
        self._tuned_mean(wire).mean([a for a, _ in staged])
        for g, (a, copied) in zip(grads, staged):
            if copied:
                g[...] = _arrays.like(a, g)

    def _wire_tuned(self, wire):
        """Return whether the average of ``wire`` has finished its first tuning schedule (or needs none)."""
        key = _wire_key(wire)
        tuned = self.__dict__.get('_tuned') if key == _wire_key(self.allreduce_grad_dtype) else \
            self.__dict__.get('_tuned_wires', {}).get(key)
        if tuned is None:
            return False
        tuner = tuned.tuning.tuner
        return not tuned._active or (tuner is not None and not tuner.tuning)

    def _host_of(self, arr):
        """Return (C-contiguous host array of ``arr``, whether it is a copy to write back)."""
        if isinstance(arr, numpy.ndarray):
            if arr.flags.c_contiguous:
                return arr, False
            return arr.copy(order='C'), True
        _arrays.check_current_device(arr, 'allreduce_grad', self._rank)
        return _arrays.as_host(arr), True

    def _tuned_mean(self, wire=None):
        """Return the plain path's average of ``wire`` under the tuner (``reduce.tune``), made at first use.

        The communicator's own wire (``allreduce_grad_dtype``) keeps its tuner in ``_tuned``
        (``engine.grad_dtype`` reads it); the wires of communication hooks keep theirs apart.
        """
        key = _wire_key(wire)
        own = key == _wire_key(self.allreduce_grad_dtype)
        if own:
            tuned = self.__dict__.get('_tuned')
        else:
            tuned = self.__dict__.setdefault('_tuned_wires', {}).get(key)
        if tuned is None or tuned.reducer is not self._reducer:
            tuned = _tune.TunedMean(self._reducer, self.allreduce_grad_dtype if own else wire)
            if own:
                self.__dict__['_tuned'] = tuned
            else:
                self.__dict__['_tuned_wires'][key] = tuned
        return tuned

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
