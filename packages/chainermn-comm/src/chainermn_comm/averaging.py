"""The averaging interface: the one way a model's gradients (or a bucket of them) are averaged.

comm's named internal API for the gradient (re-exported by :mod:`chainermn_comm.engine`):
chainermn-train's optimizer, ``BackwardOverlap``, double buffering and the hooks call only
what is here, never a communicator's private attributes.

- :class:`Averaging`: one per communicator (``comm.averaging``; None on a communicator of the
  user's own).  It owns the checked call (``guard``: agreement, watchdog, trace event), the
  reducer, the wires and their tuning state: :meth:`Averaging.mean_arrays` averages arrays in
  the wire asked for, under the tuner (``reduce.tune``), the same path for every caller.
- :class:`ModelAverage`: one per model and communicator (made by ``create_multi_node_optimizer``).
  It owns the parameter layout (collected once, refreshed only when the model's parameters
  change) and the *strategy*, decided once when it is made: the communicator's own method (a
  user's communicator, or one whose ``multi_node_mean_grad``/``allreduce_grad`` a subclass
  overrides), the built-in exact or wire average (``allreduce_grad_dtype``), or a communication
  hook (``chainermn_comm.hooks``: a user's, PowerSGD, ``Auto``).  :meth:`ModelAverage.mean`
  averages the whole model; :meth:`ModelAverage.mean_bucket` hands one bucket to the hook.
- :func:`thread_reducer`: the reducer that averages off the main thread (``BackwardOverlap``'s
  buckets, double buffering), made the one way: the same reducer as the plain path's, on a
  duplicate of the communicator, so its messages never meet the main thread's.

The way of a gradient: optimizer -> :class:`ModelAverage` (strategy) -> :class:`Averaging`
(checked call, wire, tuner) -> reducer (``reduce.node_shared``, ``reduce.chunked``; NCCL on the
GPU communicators) -> MPI or NCCL.
"""

import contextlib
import operator
import weakref

import numpy

from chainermn_comm import _arrays, trace
from chainermn_comm.reduce.off_thread import ThreadReducer, thread_reducer
from chainermn_comm.reduce import chunked as _grad
from chainermn_comm.reduce import tune as _tune

__all__ = ['Averaging', 'ModelAverage', 'ThreadReducer', 'thread_reducer', 'averaging_of', 'own_mean_method',
           'arrays_traced']

_NAME = operator.itemgetter(0)
_PARAM = operator.itemgetter(1)
_SHAPE = operator.attrgetter('shape')
_DTYPE = operator.attrgetter('dtype')
_SIZE = operator.attrgetter('size')


def _weak(method):
    """Return a weak reference to the bound ``method`` (call it to get the method), or None."""
    return None if method is None else weakref.WeakMethod(method)


def averaging_of(comm):
    """Return ``comm``'s :class:`Averaging`, or None for a communicator that has none (a user's own)."""
    return getattr(comm, 'averaging', None)


def own_mean_method(comm):
    """Return the method of ``comm`` that averages a model when a subclass overrides it, else None.

    Chainer v7's rule: a communicator class of the user's own that overrides
    ``multi_node_mean_grad`` (or the older ``allreduce_grad``) is what averages the model.
    """
    averaging = averaging_of(comm)
    if averaging is None:
        return comm.multi_node_mean_grad
    cls, base = type(comm), averaging.base_class
    if cls.multi_node_mean_grad is not base.multi_node_mean_grad:
        return comm.multi_node_mean_grad
    if cls.allreduce_grad is not base.allreduce_grad:
        return comm.allreduce_grad
    return None


class Averaging:
    """A communicator's averages: the checked call, the reducer, the wires and their tuners.

    Made by the communicator itself (``MpiCommunicatorBase``), which hands over what its class
    keeps: ``guard`` (its ``CallGuard``), ``reducer`` (its ``NodeReducer``), ``base_class``
    (the class whose averaging methods are the built-in ones), ``hold_hook`` (a context
    manager under which the communicator's own collectives refuse to run: inside a hook) and,
    on GPU communicators, ``device_mean(arrays, wire)`` (returns whether it averaged them on
    the device) and ``device_wire_tuned(wire)`` (None: no device tuner).
    """

    def __init__(self, comm, guard, reducer, base_class, hold_hook=None, device_mean=None,
                 device_wire_tuned=None):
        # The communicator owns this object: hold it (and its methods) weakly, so that no cycle
        # keeps a dropped communicator for the garbage collector, which would free its MPI
        # resources (collective frees) at a moment that differs between ranks.
        #: The communicator (a weak proxy).
        self.comm = weakref.proxy(comm)
        #: The communicator's call guard (``with guard(name, sig, key=..., traced=...)``).
        self.guard = guard
        #: The host reducer (None after ``free``).
        self.reducer = reducer
        self.base_class = base_class
        self.rank = comm.rank
        #: The NCCL group over all ranks that averages device gradients (pure_nccl, single_node), or None.
        self.nccl = None
        self._hold_hook = _weak(hold_hook)
        self._device_mean = _weak(device_mean)
        self._device_wire_tuned = _weak(device_wire_tuned)
        self._tuned = {}     # wire as given -> TunedMean (a cache of _by_label)
        self._by_label = {}  # the wire's label -> TunedMean

    # -- the wires and their tuners ---------------------------------------------------------
    def mean_arrays(self, arrays, wire):
        """Average ``arrays`` (NumPy or CuPy) over all ranks in place, ``wire`` crossing the network.

        ``wire`` is an ``allreduce_grad_dtype`` (None, a float dtype, ``'bfloat16'``, ``'auto'``);
        each wire has its own tuner.  Not checked: callers hold the guard.
        """
        if self._device_mean is not None and self._device_mean()(arrays, wire):
            return
        staged = []
        copied = False
        for g in arrays:
            if isinstance(g, numpy.ndarray) and g.flags.c_contiguous:
                staged.append(g)
            else:
                staged.append(self._host_of(g))
                copied = True
        tuned = self._tuned.get(wire)
        if tuned is None or tuned.reducer is not self.reducer:
            tuned = self.tuned(wire)
        reducer = self.reducer
        tuning = tuned.by_sizes.get((len(staged), sum(map(_SIZE, staged)))) if tuned.active else None
        if tuning is not None and reducer.tuned_by is tuning and \
                tuning.tuner.calls + 1 < tuning.tuner.quiet_until:
            # The tuner settled on this set and its choice is set: nothing to time until the
            # next check, so the call runs straight on the reducer (counted, as record() would).
            tuned.tuning = tuning
            tuning.tuner.calls += 1
            (reducer.chunked if reducer.messages_only else reducer).mean(staged, dtype=tuning.dtype)
        else:
            tuned.mean(staged)
        if copied:
            for g, a in zip(arrays, staged):
                if a is not g:
                    g[...] = _arrays.like(a, g)

    def _host_of(self, arr):
        """Return a C-contiguous host copy of ``arr`` (a CuPy array, or a non-contiguous host one)."""
        if isinstance(arr, numpy.ndarray):
            return arr.copy(order='C')
        _arrays.check_current_device(arr, 'allreduce_grad', self.rank)
        return _arrays.as_host(arr)

    def tuned(self, wire):
        """Return the :class:`~chainermn_comm.reduce.tune.TunedMean` of ``wire``, made at first use.

        Wires that are written alike (``numpy.float16`` and ``dtype('float16')``) share one.
        """
        key = None if wire is None else _tune.label(wire)
        tuned = self._by_label.get(key)
        if tuned is None or tuned.reducer is not self.reducer:
            tuned = self._by_label[key] = _tune.TunedMean(self.reducer, wire)
        try:
            self._tuned[wire] = tuned
        except TypeError:  # an unhashable wire: found by its label every time
            pass
        return tuned

    def wire_now(self):
        """Return the communicator's wire now (None: the gradients' dtype), ``'auto'`` resolved.

        None for ``'auto'`` until ``multi_node_mean_grad`` has tuned it.
        """
        wanted = self.comm.allreduce_grad_dtype
        if not _tune.is_auto(wanted):
            return wanted
        tuned = self._by_label.get(_tune.label(wanted))
        return None if tuned is None else tuned.dtype

    def own_tuned(self):
        """Return the tuner of the communicator's own wire (None before its first average)."""
        wire = self.comm.allreduce_grad_dtype
        return self._by_label.get(None if wire is None else _tune.label(wire))

    def wire_tuned(self, wire):
        """Return whether the average of ``wire`` finished its first tuning schedule (or needs none)."""
        if self._device_wire_tuned is not None:
            done = self._device_wire_tuned()(wire)
            if done is not None:
                return done
            return self._host_wire_tuned(wire) or self.comm.size == 1 or not _tune.is_auto(wire)
        return self._host_wire_tuned(wire)

    def _host_wire_tuned(self, wire):
        tuned = self._by_label.get(None if wire is None else _tune.label(wire))
        if tuned is None:
            return False
        tuner = tuned.tuning.tuner
        return not tuned.active or (tuner is not None and not tuner.tuning)

    @contextlib.contextmanager
    def hook_running(self, hook):
        """Run a hook under this: the communicator's own collectives raise a clear error meanwhile."""
        if self._hold_hook is None:
            yield
            return
        with self._hold_hook()(hook):
            yield

    def shard_collectives(self):
        """Return the reduce-scatter / all-gather of owned arrays (``reduce.shard``; ``shard_state=True``)."""
        shard = self.__dict__.get('_shard')
        if shard is None:
            from chainermn_comm.reduce.shard import ShardCollectives
            shard = self._shard = ShardCollectives(self.comm.mpi_comm, lambda: self.guard, self.nccl,
                                                   reducer_of=lambda: self.reducer)
        return shard

    def free(self):
        """Release the reducer (collective); the communicator's ``finalize`` calls it."""
        reducer, self.reducer = self.reducer, None
        if reducer is not None:
            reducer.free()


class ModelAverage:
    """Average one model's gradients over a communicator with the strategy decided when it is made.

    ``hook`` is a :class:`~chainermn_comm.hooks.CommHook` (None: the communicator's own
    average).  ``zero_fill``: parameters without a gradient take part with zeros.  ``builtin``:
    the built-in average whatever the communicator's class overrides (its own
    ``multi_node_mean_grad`` uses that).  ``background``: an object whose ``swap(model)`` averages
    in a background thread and hands back the last average (chainermn-train's double buffering,
    which takes the built-in wires only: ``hook`` then names the wire it uses).
    """

    def __init__(self, comm, model, hook=None, zero_fill=True, builtin=False, background=None,
                 shard=None):
        self.comm = comm
        self.model = model
        self.hook = hook
        self.zero_fill = bool(zero_fill)
        self.averaging = averaging_of(comm)
        self._sig = None
        self._ids = None
        self._params = []
        self._names = []
        #: What averages in a background thread (``double_buffering=True``: its ``swap(model)``).
        self.background = background
        #: What averages each gradient to its owner (``shard_state=True``: its ``mean(zero_fill)``).
        self.shard = shard
        if shard is not None:
            self.strategy = 'shard'
        elif background is not None:
            self.strategy = 'background'
        elif hook is not None:
            self.strategy = 'hook'
        elif not builtin and (self.averaging is None or own_mean_method(comm) is not None):
            self.strategy = 'communicator'
        else:
            self.strategy = 'wire'
        # The function (not a bound method: no cycle through this object) that ``mean`` runs.
        self._run = _STRATEGIES[self.strategy]

    def mean(self, zero_fill=None):
        """Average the model's gradients in place with the strategy (``zero_fill`` None: as made)."""
        self._run(self, zero_fill)

    def __repr__(self):
        return '<ModelAverage {} of {} on {!r}>'.format(
            self.strategy, type(self.model).__name__, self.comm)

    # -- the layout ---------------------------------------------------------------------------
    def signature(self):
        """Return ``(name, shape, dtype)`` of every parameter (None, None when uninitialised), by name.

        Refreshes the layout (the parameters that take part, in the order every rank uses) when
        the model's parameters changed.
        """
        named = sorted(self.model.namedparams(), key=_NAME)
        sig = []
        for name, p in named:
            a = p.array
            sig.append((name, None, None) if a is None else (name, tuple(a.shape), a.dtype.str))
        sig = tuple(sig)
        ids = list(map(id, map(_PARAM, named)))
        if sig != self._sig or ids != self._ids:
            self._refresh(named)
            self._sig, self._ids = sig, ids
        return sig

    def _refresh(self, named):
        """Collect the initialised parameters once each (under their first name), and the hooks' names."""
        params, seen = [], set()
        for _, p in named:
            if p.array is None or id(p) in seen:
                continue
            seen.add(id(p))
            params.append(p)
        by_id = {}
        for n, p in self.model.namedparams():
            by_id[id(p)] = n
        self._params = params
        self._names = [by_id[id(p)] for p in params]

    def _taking_part(self, zero_fill):
        """Return ``(params, names)`` whose gradients this average takes (zeros given where ``zero_fill``)."""
        self.signature()
        params, names = self._params, self._names
        missing = False
        for p in params:
            if p.grad is None:
                missing = True
                break
        if not missing:
            return params, names
        kept, kept_names = [], []
        for p, n in zip(params, names):
            if p.grad is None:
                if not zero_fill:
                    continue
                _grad.zero_grad(p)
            kept.append(p)
            kept_names.append(n)
        return kept, kept_names

    # -- the strategies ------------------------------------------------------------------------
    def _mean_background(self, zero_fill=None):
        """Double buffering: start this update's average in the background, take the last one."""
        self.background.swap(self.model)

    def _mean_shard(self, zero_fill=None):
        """Sharded optimizer state: average each gradient to the rank that owns its parameter."""
        self.shard.mean(self.zero_fill if zero_fill is None else zero_fill)

    def _mean_own(self, zero_fill=None):
        """The communicator's own method (a user's communicator, or a subclass that overrides it)."""
        zero_fill = self.zero_fill if zero_fill is None else zero_fill
        method = own_mean_method(self.comm)
        (method or self.comm.multi_node_mean_grad)(self.model, zero_fill)

    def _mean_exact(self, zero_fill=None):
        """The built-in average: exact, or the communicator's wire (``allreduce_grad_dtype``)."""
        self.signature()
        zero_fill = self.zero_fill if zero_fill is None else zero_fill
        params = self._params
        for p in params:
            if p.grad is None:
                params = self._taking_part(zero_fill)[0]
                break
        grads = list(map(operator.attrgetter('grad'), params))
        shapes = tuple(map(_SHAPE, grads))
        try:
            codes = tuple(map(_grad.DTYPE_CODES.__getitem__, map(_DTYPE, grads)))
        except KeyError:
            shapes, codes = _grad.params_key(params, 'grad')
        model, averaging, wire = self.model, self.averaging, self.comm.allreduce_grad_dtype

        def sig():
            return (('params', _grad.params_signature(model, params, 'grad')),)

        traced = _traced(grads, wire) if trace.ON else None
        with averaging.guard('allreduce_grad', sig, key=(shapes, codes), traced=traced):
            for i, p in enumerate(params):
                g = grads[i]
                if isinstance(g, numpy.ndarray) and not g.flags.c_contiguous:
                    g = grads[i] = p.grad = g.copy(order='C')  # keeps 0-d shapes
            averaging.mean_arrays(grads, wire)

    def _mean_hook(self, zero_fill=None):
        """A communication hook: one call with every gradient of the model as one bucket."""
        from chainermn_comm.guard import stable_code
        from chainermn_comm.hooks.base import GradBucket
        zero_fill = self.zero_fill if zero_fill is None else zero_fill
        params, names = self._taking_part(zero_fill)
        hook, averaging, model = self.hook, self.averaging, self.model
        if averaging is None:  # a communicator of the user's own: no check
            hook(self.comm, GradBucket([p.grad for p in params], names))
            return
        label = str(hook)

        def sig():
            return (('params', _grad.params_signature(model, params, 'grad')), ('comm_hook', label))

        shapes, codes = _grad.params_key(params, 'grad')
        traced = None
        if trace.ON:
            wire = hook.wire if hook.is_wire else None
            traced = _traced([p.grad for p in params], None if isinstance(wire, str) else wire)
            if isinstance(wire, str) and wire != 'auto':  # 'auto', 'bfloat16': no dtype
                traced['wire_dtype'] = wire
            traced['hook'] = label
        with averaging.guard('allreduce_grad', sig, key=(shapes, codes, stable_code(label)), traced=traced):
            grads = []
            for p in params:
                g = p.grad
                if isinstance(g, numpy.ndarray) and not g.flags.c_contiguous:
                    g = p.grad = g.copy(order='C')
                grads.append(g)
            with averaging.hook_running(hook):
                hook(self.comm, GradBucket(grads, names))

    def mean_bucket(self, bucket):
        """Hand one bucket of gradients (``overlap=True``) to the hook, inside the caller's checked call."""
        averaging = self.averaging
        if averaging is None:
            self.hook(self.comm, bucket)
            return
        with averaging.hook_running(self.hook):
            self.hook(self.comm, bucket)


_STRATEGIES = {'shard': ModelAverage._mean_shard,
               'background': ModelAverage._mean_background, 'hook': ModelAverage._mean_hook,
               'communicator': ModelAverage._mean_own, 'wire': ModelAverage._mean_exact}


def _traced(grads, wire):
    return arrays_traced(grads, 'mean', wire)


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

