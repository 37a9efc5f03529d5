"""Sharded optimizer state (``shard_state=True``): each rank keeps and updates only its share.

The parameters are partitioned over the ranks (whole parameters, balanced by size, the same on
every rank, recomputed only when the model's parameters change).  One update:

1. :meth:`ShardedUpdate.mean`: the gradients are averaged to each parameter's owner (a
   reduce-scatter, ``comm.averaging.shard_collectives()``); the other ranks' copies are left alone;
2. :meth:`ShardedUpdate.update`: the wrapped optimizer's ``update()`` runs with the update rules
   of the parameters this rank does not own switched off (their state is never allocated), its
   per-parameter hooks called for the owned parameters only, ``GradientClipping`` on the global
   norm (one small all-reduce of the shares' sums of squares) and dynamic loss scaling's
   non-finite check over every rank's share (one small all-reduce);
3. the updated parameters are all-gathered from their owners, so every rank holds the whole
   model, equal bit for bit.

Refused: optimizer hooks that read every parameter at once other than ``GradientClipping``
(named at the update that meets them, before any collective).
"""

import heapq
import math
import warnings

import numpy

from chainermn_comm import engine

__all__ = ['ShardedUpdate', 'partition', 'state_bytes', 'unsupported_hooks', 'refuse_options']


def refuse_options(comm, double_buffering, overlap, comm_hook):
    """Raise ValueError for options that sharded state cannot honour; return the reduce-scatter's wire.

    ``overlap`` is honoured: ``BackwardOverlap`` reduce-scatters its buckets to their owners.
    """
    what = 'create_multi_node_optimizer(shard_state=True)'
    if double_buffering:
        raise ValueError(
            '{}: double_buffering=True is refused: it applies the previous iteration\'s averaged '
            'gradients while the next iteration runs, but with sharded state the next forward pass '
            'needs the parameters all-gathered from their owners after this update, so nothing is '
            'left to overlap; use one or the other'.format(what))
    if comm_hook is not None and not comm_hook.is_wire:
        raise ValueError(
            '{}: comm_hook={!r} is refused: a communication hook such as PowerSGD compresses and '
            'averages whole gradients (low-rank factors and error feedback over every parameter), '
            'not one owner\'s share; use a wire (Exact, Float16, BFloat16, Auto) or '
            'shard_state=False'.format(what, comm_hook))
    return getattr(comm, 'allreduce_grad_dtype', None) if comm_hook is None else comm_hook.wire


def partition(sizes, size):
    """Return the owner rank of each parameter: whole parameters balanced by ``sizes``.

    Largest first, each to the rank with the least so far (ties: the lower rank; equal sizes:
    the earlier parameter first), so every rank computes the same owners.  No rank holds more
    than the average plus the largest parameter.
    """
    order = sorted(range(len(sizes)), key=lambda i: (-int(sizes[i]), i))
    heap = [(0, r) for r in range(size)]
    owners = [0] * len(sizes)
    for i in order:
        load, r = heapq.heappop(heap)
        owners[i] = r
        heapq.heappush(heap, (load + int(sizes[i]), r))
    return owners


def state_bytes(optimizer):
    """Return the bytes of every update rule's state on this rank (fp32 master copies included)."""
    total = 0
    seen = set()
    for p in optimizer.target.params():
        rule = getattr(p, 'update_rule', None)
        if rule is None or id(rule) in seen:
            continue
        seen.add(id(rule))
        for v in (rule.state or {}).values():
            total += int(getattr(v, 'nbytes', 0))
        fp32 = getattr(rule, '_fp32_param', None)
        if fp32 is not None and fp32.array is not None:
            total += int(fp32.array.nbytes)
    return total


def _hook_tables(opt):
    hookable = getattr(opt, '_hookable', None)
    if hookable is None:
        return []
    return [getattr(hookable, '_pre_update_hooks', {}) or {}, getattr(hookable, '_post_update_hooks', {}) or {}]


def _is_global_clipping(hook):
    from chainer.optimizer_hooks import GradientClipping
    return isinstance(hook, GradientClipping)


def unsupported_hooks(opt):
    """Return the names of ``opt``'s hooks that sharded state cannot run (whole-model hooks it does not know)."""
    bad = []
    for table in _hook_tables(opt):
        for name, hook in table.items():
            if getattr(hook, 'call_for_each_param', False) or _is_global_clipping(hook):
                continue
            bad.append('{} ({})'.format(name, type(hook).__name__))
    return bad


class ShardedUpdate:
    """The sharded average and step of one optimizer over one communicator (see the module doc).

    ``wire``: the wire of the reduce-scatter (None, ``numpy.float16``, ``'bfloat16'``, ``'auto'``).
    """

    def __init__(self, comm, optimizer, wire=None):
        self.comm = comm
        self.optimizer = optimizer
        self.wire = wire
        averaging = engine.averaging_of(comm)
        if averaging is None:
            raise ValueError(
                'create_multi_node_optimizer(shard_state=True): communicator {!r} has no reduce-scatter '
                'of owned arrays (it has no averaging interface); use a communicator made by '
                'chainermn.create_communicator, or shard_state=False'.format(comm))
        self.collectives = averaging.shard_collectives()
        self.check_hooks()
        self._sig = None
        self.params = []
        self.names = []
        self.owners = ()

    def check_hooks(self, extra=None, name=None):
        """Raise ValueError naming the optimizer's hooks (and ``extra``, about to be added) that
        sharded state cannot run."""
        bad = unsupported_hooks(self.optimizer) if getattr(self.optimizer, '_hookable', None) else []
        if extra is not None and not (getattr(extra, 'call_for_each_param', False) or
                                      _is_global_clipping(extra)):
            bad.append('{} ({})'.format(name or getattr(extra, 'name', None) or
                                        getattr(extra, '__name__', '?'), type(extra).__name__))
        if bad:
            raise ValueError(
                'rank {}: create_multi_node_optimizer(shard_state=True) cannot run the optimizer '
                'hook(s) {}: each rank holds the averaged gradient of its own share only, and these '
                'hooks read every parameter at once. Per-parameter hooks (WeightDecay, Lasso, '
                'GradientHardClipping, GradientLARS, GradientNoise) and GradientClipping work; '
                'remove the hook or use shard_state=False'.format(self.comm.rank, ', '.join(bad)))

    # -- the partition --------------------------------------------------------------------
    def layout(self):
        """Return ``(params, owners)``, partitioned again only when the model's parameters changed."""
        named = sorted(self.optimizer.target.namedparams(), key=lambda kv: kv[0])
        sig = tuple((n, id(p), None if p.array is None else (tuple(p.array.shape), p.array.dtype.str))
                    for n, p in named)
        if sig != self._sig:
            params, names, seen = [], [], set()
            for n, p in named:
                if p.array is None or id(p) in seen:
                    continue
                seen.add(id(p))
                params.append(p)
                names.append(n)
            self.params, self.names = params, names
            self.owners = tuple(partition([p.array.nbytes for p in params], self.comm.size))
            self._sig = sig
        return self.params, self.owners

    def owners_of(self, params):
        """Return the owner rank of each of ``params`` (the model's, after :meth:`layout`)."""
        owner = {id(p): r for p, r in zip(self.params, self.owners)}
        return tuple(owner[id(p)] for p in params)

    def owned(self):
        """Return the parameters this rank owns (after :meth:`layout`)."""
        rank = self.comm.rank
        return [p for p, r in zip(self.params, self.owners) if r == rank]

    # -- one update ---------------------------------------------------------------------
    def mean(self, zero_fill=True):
        """Average the gradients to their owners (a parameter without a gradient takes part with zeros)."""
        self.check_hooks()
        params, owners = self.layout()
        grads = []
        for p in params:
            g = p.grad
            if g is None:
                xp = p.device.xp if hasattr(p, 'device') else numpy
                g = p.grad = xp.zeros_like(p.array)
            elif isinstance(g, numpy.ndarray) and not g.flags.c_contiguous:
                g = p.grad = g.copy(order='C')
            grads.append(g)
        self.collectives.mean_to_owners(grads, owners, wire=self.wire)

    def update(self):
        """Run the wrapped optimizer's update on this rank's share, then all-gather the parameters."""
        opt = self.optimizer
        params, owners = self.layout()
        mine = {id(p) for p in self.owned()}
        switched = []
        for p in opt.target.params():
            rule = getattr(p, 'update_rule', None)
            if rule is not None and rule.enabled and p.array is not None and id(p) not in mine:
                rule.enabled = False
                switched.append(rule)
        d = opt.__dict__
        d['call_hook'] = self._call_hook
        d['check_nan_in_grads'] = self._check_nan_in_grads
        try:
            opt.update()
        finally:
            del d['call_hook']
            del d['check_nan_in_grads']
            for rule in switched:
                rule.enabled = True
        # Parameters updated in float32 (use_fp32_update) get new arrays: read them now.
        self.collectives.gather_from_owners([p.array for p in params], owners)

    def serialize(self, serializer):
        """Save or load this rank's share of the state (``t``, ``epoch`` and the owned rules' state).

        Loading leaves the other ranks' rules without state, also from a snapshot that has it
        (an unsharded one): only the owned share is kept.
        """
        opt = self.optimizer
        self.layout()
        mine = {id(p) for p in self.owned()}
        others = [p.update_rule for p in opt.target.params()
                  if getattr(p, 'update_rule', None) is not None and id(p) not in mine]
        switched = [rule for rule in others if rule.enabled]
        for rule in switched:
            rule.enabled = False  # Chainer then leaves state that a snapshot lacks unallocated
        try:
            opt.serialize(serializer)
        finally:
            for rule in switched:
                rule.enabled = True
        from chainer.serializer import Deserializer
        if isinstance(serializer, Deserializer):
            for rule in others:
                rule._state = None
                fp32 = getattr(rule, '_fp32_param', None)
                if fp32 is not None:
                    rule._fp32_param = None

    # -- what the wrapped optimizer calls during the update ---------------------------------
    def _call_hook(self, hook):
        opt = self.optimizer
        if _is_global_clipping(hook):
            self._clip_global(hook)
        elif getattr(hook, 'call_for_each_param', False):
            for p in self.owned():
                hook(p.update_rule, p)
        else:  # refused in mean(); a hook added between mean() and update() lands here
            raise ValueError('rank {}: shard_state=True cannot run optimizer hook {!r}'.format(
                self.comm.rank, hook))
        realloc = getattr(opt, 'reallocate_cleared_grads', None)
        if realloc is not None:
            realloc()

    def _clip_global(self, hook):
        """``GradientClipping`` on the norm of the whole averaged gradient (every rank's share)."""
        sq = 0.0
        for p in self.owned():
            g = p.grad.reshape(-1)
            sq += float(g.dot(g))
        total = float(self.comm.allreduce(numpy.array([sq], dtype=numpy.float64))[0])
        norm = math.sqrt(total)
        rate = hook.threshold / norm if norm > 0 else math.inf
        if rate >= 1:
            return
        for p in self.owned():
            p.grad *= p.grad.dtype.type(rate)

    def _check_nan_in_grads(self):
        """Dynamic loss scaling's check over every rank's share: all ranks skip, or none."""
        opt = self.optimizer
        opt._loss_scaling_isnan = False
        if not opt._loss_scaling_is_dynamic:
            return
        found = None
        for p, name, owner in zip(self.params, self.names, self.owners):
            if owner != self.comm.rank:
                continue
            xp = p.device.xp
            if not bool(xp.all(xp.isfinite(p.grad))):
                found = name
                break
        flags = self.comm.allreduce(numpy.array([0 if found is None else 1], dtype=numpy.int32))
        if int(flags[0]):
            opt._loss_scaling_isnan = True
            opt._loss_scaling_isnan_ever = True
            where = 'param.grad of {}'.format(found) if found is not None else \
                "another rank's share of the gradients"
            warnings.warn('Non finite number found in {} (iteration: {}, loss_scale: {})'.format(
                where, opt.t, opt._loss_scale))
