"""create_multi_node_optimizer: a Chainer optimizer whose updates use gradients averaged over ranks."""

import weakref

from chainermn_comm import engine, hooks, trace, voice
from chainermn_train import _fingerprint, _finite, _params, _trainer_run

__all__ = ['create_multi_node_optimizer', 'MultiNodeOptimizer']

# Attributes that live on the wrapper itself; everything else is read from and written to the
# wrapped optimizer.
_OWN = frozenset([
    'actual_optimizer', 'communicator', 'zero_fill', 'double_buffering', 'overlap', 'comm_hook',
    '_mn_synced_sig', '_mn_double', '_overlap', '_mn_batch_checked', '_mn_left', '_mn_finite',
    '_mn_avg', 'shard_state', '_mn_shard',
])

#: Each stateful communication hook -> (a weak reference to) the optimizer it serves.
_HOOK_OWNERS = weakref.WeakKeyDictionary()


def _claim_hook(hook, optimizer):
    """Record that ``hook`` serves ``optimizer``; raise ValueError when it serves another one already.

    A hook that keeps state (PowerSGD's error memories and update count, Auto's tuner) keeps it
    for one model: shared by two optimizers (a GAN's generator and discriminator) it would mix
    their memories and count updates twice.
    """
    if hook is None or not getattr(hook, 'stateful', True):
        return
    try:
        owner = _HOOK_OWNERS.get(hook)
    except TypeError:  # not weakly referenceable: cannot be tracked
        return
    other = owner() if owner is not None else None
    if other is not None and other is not optimizer:
        raise ValueError(
            'create_multi_node_optimizer: the communication hook {!r} already serves another '
            'multi-node optimizer ({!r}); a hook keeps state (error memories, update counts, '
            'tuning) for one model: give each optimizer its own, e.g. comm_hook={}(...) for '
            'each'.format(hook, other.actual_optimizer, type(hook).__name__))
    _HOOK_OWNERS[hook] = weakref.ref(optimizer)


def _batch_size(args, kwds):
    """Return the length of the first batch-like argument of ``update`` (None if there is none)."""
    for value in list(args) + list(kwds.values()):
        shape = getattr(value, 'shape', None)
        if shape:
            return int(shape[0])
        if isinstance(value, (list, tuple)) and value:
            return len(value)
    return None


def _on_device(link):
    """Return True when ``link``'s parameters live on a CUDA device (timed with CUDA events)."""
    return getattr(getattr(link, 'xp', None), '__name__', '') == 'cupy'


class MultiNodeOptimizer:
    """Wrap a Chainer optimizer: average gradients over ranks and keep parameters in step.

    Every attribute that is not the wrapper's own (``lr``, ``t``, ``target``, hooks, ...)
    is read from and written to the wrapped optimizer.
    """

    def __init__(self, actual_optimizer, communicator, double_buffering=False, zero_fill=True,
                 overlap=False, check_finite=None, comm_hook=None, shard_state=False):
        if double_buffering and overlap:
            raise ValueError('create_multi_node_optimizer: double_buffering=True and overlap=True '
                             'cannot be combined; choose one')
        comm_hook = hooks.resolve(comm_hook)
        if double_buffering and comm_hook is not None and not comm_hook.is_wire:
            raise ValueError('create_multi_node_optimizer: double_buffering=True averages in a '
                             'background thread and takes only the built-in wires as comm_hook '
                             '(Exact, Float16, BFloat16, Auto); got {!r}: use overlap=True or '
                             'neither'.format(comm_hook))
        # -- sharded optimizer state (issue 52; chainermn_train._sharded) --
        shard = None
        if shard_state:
            from chainermn_train import _sharded
            shard = _sharded.ShardedUpdate(communicator, actual_optimizer, _sharded.refuse_options(
                communicator, double_buffering, overlap, comm_hook))
        # -- end sharded --
        finite = _finite.resolve_mode(check_finite)
        if finite is not None and (double_buffering or overlap):
            if check_finite is not None:
                raise ValueError('create_multi_node_optimizer: check_finite={!r} needs the plain '
                                 'update (double_buffering=False, overlap=False): those average '
                                 'gradients while or after they change'.format(check_finite))
            finite = None  # $CHAINERMN_CHECK_FINITE applies where it can (docs/environment.md)
        d = self.__dict__
        d['actual_optimizer'] = actual_optimizer
        d['communicator'] = communicator
        d['zero_fill'] = bool(zero_fill)
        d['double_buffering'] = bool(double_buffering)
        d['overlap'] = bool(overlap)
        #: The communication hook that averages the gradients (None: the communicator's own wire).
        d['comm_hook'] = comm_hook
        d['_mn_synced_sig'] = None
        d['_overlap'] = None
        d['_mn_double'] = None
        d['_mn_batch_checked'] = False
        d['_mn_left'] = None  # while tracing: when the last update returned (trace.now())
        d['_mn_finite'] = None if finite is None else _finite.FiniteCheck(communicator, finite)
        #: The averaging interface of the target (``chainermn_comm.averaging.ModelAverage``).
        d['_mn_avg'] = None
        _claim_hook(comm_hook, self)
        d['shard_state'] = shard is not None
        d['_mn_shard'] = shard  # sharded optimizer state (issue 52), or None
        if double_buffering:
            from chainermn_train._double_buffer import DoubleBufferingReducer
            d['_mn_double'] = DoubleBufferingReducer(communicator, zero_fill=zero_fill,
                                                     hook=comm_hook)
        if getattr(actual_optimizer, 'target', None) is not None:
            self._mn_bcast_params()

    # -- delegation ---------------------------------------------------------------
    def __getattr__(self, name):
        if name in _OWN:
            raise AttributeError(name)
        return getattr(self.__dict__['actual_optimizer'], name)

    def __setattr__(self, name, value):
        if name in _OWN:
            self.__dict__[name] = value
        else:
            setattr(self.actual_optimizer, name, value)

    def __dir__(self):
        return sorted(set(dir(type(self))) | set(self.__dict__) | set(dir(self.actual_optimizer)))

    def __repr__(self):
        return '<MultiNodeOptimizer of {!r} on {!r}>'.format(self.actual_optimizer, self.communicator)

    @property
    def skipped_updates(self):
        """Updates skipped because a rank's gradient held NaN or Inf (``check_finite='skip'``)."""
        finite = self._mn_finite
        return 0 if finite is None else finite.skipped

    # -- Optimizer API --------------------------------------------------------------
    def setup(self, link):
        """Set up the wrapped optimizer on ``link`` and broadcast rank 0's parameters."""
        self.actual_optimizer.setup(link)
        self._mn_bcast_params()
        return self

    def serialize(self, serializer):
        """Serialize the wrapped optimizer's state (hyperparameters, ``t``, per-parameter states)
        and the communication hook's state (under ``comm_hook/``, when it has any)."""
        if self._mn_shard is not None:  # sharded optimizer state (issue 52): this rank's share
            self._mn_shard.serialize(serializer)
        else:
            self.actual_optimizer.serialize(serializer)
        if self.comm_hook is not None:
            self.comm_hook.serialize(serializer['comm_hook'])

    def add_hook(self, hook, name=None, timing='auto'):
        """Register an optimizer hook on the wrapped optimizer (with shard_state: one it can run)."""
        if self._mn_shard is not None:  # sharded optimizer state (issue 52): refused here, named
            self._mn_shard.check_hooks(hook, name)
        self.actual_optimizer.add_hook(hook, name=name, timing=timing)

    def update(self, lossfun=None, *args, **kwds):
        """Compute (when ``lossfun`` is given), average and apply gradients, like ``Optimizer.update``."""
        if not trace.ON:
            return self._mn_update(lossfun, args, kwds, False)
        # Traced: the update is a 'step' event, the time since the last one a 'data' event.
        entered = trace.now()
        if self._mn_left is not None:
            trace.record('data', 'data', self._mn_left, entered)
        try:
            return self._mn_update(lossfun, args, kwds, True)
        finally:
            left = trace.now()
            trace.record('update', 'step', entered, left, {'iteration': int(self.actual_optimizer.t)})
            self.__dict__['_mn_left'] = left

    def _mn_update(self, lossfun, args, kwds, on):
        opt = self.actual_optimizer
        target = opt.target
        if target is None:
            raise RuntimeError('rank {}: the multi-node optimizer is not set up; call '
                               'optimizer.setup(model) before update()'.format(self.communicator.rank))
        if not self._mn_batch_checked and self.communicator.size > 1:
            self._mn_check_batch_sizes(_batch_size(args, kwds) if lossfun is not None else None,
                                       (args, kwds) if lossfun is not None else None)
        if lossfun is not None:
            # Parameters that exist before the forward pass are made equal before it runs.
            if self._mn_params_created():
                self._mn_bcast_params()
            device = on and _on_device(target)
            started = trace.begin(device) if on else None
            loss = lossfun(*args, **kwds)
            if on:
                trace.end(started, 'forward', 'compute')
            if self.overlap and not self._mn_params_created():
                target.cleargrads()
                self._mn_overlap().run_backward(loss, loss_scale=opt._loss_scale)  # traces backward
                del loss
                self._mn_apply(on)
                return
            if getattr(opt, '_use_cleargrads', True):
                target.cleargrads()
            else:
                target.zerograds()
            started = trace.begin(device) if on else None
            loss.backward(loss_scale=opt._loss_scale)
            if on:
                trace.end(started, 'backward', 'compute')
            del loss
        if self._mn_params_created():
            # Parameters created by this forward pass (lazily initialised links) hold each rank's
            # own random values, so the gradients do not belong to one model: take rank 0's
            # parameters and skip this update rather than run the user's forward pass again.
            self._mn_bcast_params()
            return
        finite = self._mn_finite
        if finite is not None:
            finite.before(target)
        self._mn_avg.mean(self.zero_fill)  # fresh: _mn_params_created made it for this target
        if finite is not None and not self._mn_finite_ok(finite):
            return
        self._mn_apply(on)

    def _mn_finite_ok(self, finite):
        """Return True when the update may go on; skip it or raise when a rank's gradient was not finite."""
        opt = self.actual_optimizer
        message = finite.after(int(opt.t))
        if message is None:
            return True
        if finite.mode == 'raise':
            raise FloatingPointError('rank {}: {} (check_finite=\'raise\')'.format(
                self.communicator.rank, message))
        finite.skip(message)
        # Chainer's dynamic loss scaling skips the update itself and lowers the scale.
        return bool(getattr(opt, '_loss_scaling_is_dynamic', False))

    def _mn_apply(self, on):
        """Run the wrapped optimizer's own update (a 'compute' event 'optimizer' while tracing)."""
        run = self.actual_optimizer.update if self._mn_shard is None else self._mn_shard.update
        if not on:
            return run()
        started = trace.begin(_on_device(self.actual_optimizer.target))
        run()
        trace.end(started, 'optimizer', 'compute')

    def new_epoch(self, auto=False):
        """Start a new epoch on the wrapped optimizer."""
        self.actual_optimizer.new_epoch(auto=auto)

    # -- multi-node part ------------------------------------------------------------
    def finish(self):
        """Wait for a gradient all-reduce still running in the background (double buffering)."""
        if self._mn_double is not None:
            self._mn_double.finish()

    def _mn_overlap(self):
        if self._overlap is None:
            from chainermn_train._overlap import BackwardOverlap
            self.__dict__['_overlap'] = BackwardOverlap(self.communicator, self.actual_optimizer.target,
                                                        hook=self.comm_hook, average=self._mn_average())
        return self._overlap

    def _mn_average(self):
        """Return the averaging interface of the target, made when the target or the hook changed."""
        avg = self._mn_avg
        target = self.actual_optimizer.target
        if avg is None or avg.model is not target or avg.hook is not self.comm_hook:
            avg = engine.ModelAverage(self.communicator, target, self.comm_hook, self.zero_fill,
                                      background=self._mn_double, shard=self._mn_shard)
            self.__dict__['_mn_avg'] = avg
        return avg

    def _mn_check_batch_sizes(self, size, batch=None):
        """At the first update: raise ValueError on every rank unless every rank feeds the same batch size.

        One small allgather, once.  Ranks whose batch size is unknown (no batch passed to
        ``update``) are not compared.
        """
        self.__dict__['_mn_batch_checked'] = True
        comm = self.communicator
        # A digest of the batch rides along: identical batches on every rank warn (_fingerprint).
        gathered = comm.allgather_obj((size, _fingerprint.batch_digest(batch)))
        sizes = [s for s, _ in gathered]
        known = {s for s in sizes if s is not None}
        if len(known) > 1:
            raise voice.agreed(ValueError(
                'rank {}: the ranks of the multi-node optimizer\'s communicator feed batches of '
                'different sizes to its first update ({}). Every rank averages its gradient with '
                'equal weight and the ranks reach epoch boundaries at different iterations (their '
                'extensions would then run collectives on some ranks only): give every rank\'s '
                'iterator the same batch_size (the global batch is batch_size x {} ranks) and '
                'scatter the dataset with chainermn.scatter_dataset'.format(
                    comm.rank, ', '.join('rank {}: {}'.format(r, s) for r, s in enumerate(sizes)),
                    comm.size)), comm)   # the same on every rank: rank 0 reports it
        _fingerprint.warn_identical_batches(comm, [d for _, d in gathered])

    def _mn_bcast_params(self):
        target = self.actual_optimizer.target
        sig = self._mn_average().signature()
        self._mn_check_same_model(sig)
        self.communicator.bcast_data(target)
        self.__dict__['_mn_synced_sig'] = sig

    def _mn_check_same_model(self, sig):
        """Raise ValueError on every rank unless every rank holds rank 0's parameters."""
        comm = self.communicator
        root_sig = comm.bcast_obj(sig)
        differing = comm.allreduce_obj(int(sig != root_sig))
        if differing:
            raise ValueError(
                'rank {}: {} of the {} ranks of the multi-node optimizer\'s communicator hold other '
                'parameters than its rank 0 (this rank: {}). It averages gradients over ranks '
                'that hold the same model: create it on a communicator of exactly those ranks (for '
                'model parallelism the ranks that hold the same part, e.g. '
                'comm.split(part_index, comm.rank))'.format(
                    comm.rank, differing, comm.size, _params.describe_difference(sig, root_sig)))

    def _mn_params_created(self):
        """Return True when the initialised parameters changed since the last broadcast."""
        avg = self._mn_avg
        if avg is None or avg.model is not self.actual_optimizer.target or avg.hook is not self.comm_hook:
            avg = self._mn_average()
        return avg.signature() != self._mn_synced_sig

    def _mn_mark_synced(self):
        """Record that every rank holds the same parameters now (e.g. after loading a checkpoint)."""
        self.__dict__['_mn_synced_sig'] = self._mn_average().signature()


def create_multi_node_optimizer(actual_optimizer, communicator, double_buffering=False, zero_fill=True,
                                overlap=False, check_finite=None, comm_hook=None, shard_state=False):
    """Create a multi-node optimizer from a Chainer optimizer.

    Args:
        actual_optimizer: Chainer optimizer (e.g. ``chainer.optimizers.Adam()``), set up or not.
        communicator: ChainerMN communicator.
        double_buffering (bool): overlap the all-reduce of this iteration's gradients with the
            next iteration's forward/backward; each update then uses the previous iteration's
            averaged gradients (the first update uses its own).
        zero_fill (bool): give parameters without a gradient a zero gradient so that every rank
            reduces the same arrays.
        overlap (bool): all-reduce gradients during backward (bucketed), then update.
        check_finite (str): before each average, look for NaN/Inf in every rank's own gradient;
            when some rank's holds any, every rank names that rank and parameter and either skips
            the update (``'skip'``, as loss scaling does) or raises ``FloatingPointError``
            (``'raise'``).
            ``'off'``: no check; None: ``$CHAINERMN_CHECK_FINITE`` (default off: it reads every
            gradient once more).  Needs the plain update (no double buffering or overlap).
        comm_hook: what averages the gradients (``chainermn.hooks``): None (the communicator's
            ``allreduce_grad_dtype``), a built-in hook (``hooks.Exact()``, ``hooks.Float16()``,
            ``hooks.BFloat16()``, ``hooks.Auto()``, ``hooks.PowerSGD(rank=4)``), a
            :class:`chainermn.hooks.CommHook` of your own or a function ``fn(comm, bucket)``;
            with ``overlap=True`` it is called once per bucket.  Its state is saved with the
            optimizer.
        shard_state (bool): keep and update only this rank's share of the optimizer state
            (ZeRO stage 1-2): gradients are averaged to each parameter's owner, each rank runs the
            update rules of its own parameters, and the updated parameters are all-gathered
            (docs/sharded_state.md); with ``overlap=True`` the buckets are reduce-scattered to
            their owners during backward.  Not with ``double_buffering`` or a ``comm_hook`` other
            than the built-in wires.

    Returns:
        A :class:`MultiNodeOptimizer` that behaves like ``actual_optimizer``.
    """
    _trainer_run.install()
    return MultiNodeOptimizer(actual_optimizer, communicator, double_buffering=double_buffering,
                              zero_fill=zero_fill, overlap=overlap, check_finite=check_finite,
                              comm_hook=comm_hook, shard_state=shard_state)
