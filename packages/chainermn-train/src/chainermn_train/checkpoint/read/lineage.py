"""Whose a generation is: its run identity, and the optimizer whose state it holds.

Every snapshot file records (as metadata, see ``npz.META_PREFIX``):

- ``run``: the run identity, made by rank 0 when a job first starts (every rank takes rank 0's),
  adopted from the loaded generation when a job resumes or reshards, so one training run keeps one
  identity across restarts and resizes (its *lineage*);
- ``optimizer/<name>/class`` and ``optimizer/<name>/state``: for each optimizer of the updater, its
  class (``module.QualName``) and the names of its per-parameter state (``m,v`` for Adam).

:func:`screen` turns that into reasons to refuse a whole generation: files of more than one run
(two jobs wrote into one directory), and an optimizer other than this job's (Adam's ``v`` must not
become MomentumSGD's momentum) unless only the model weights are loaded.
"""

import copy
import uuid

import chainer
import numpy

__all__ = ['RUN_KEY', 'new_run_id', 'optimizers_of', 'state_keys', 'optimizer_meta', 'run_of',
           'screen', 'models_of']

#: Metadata key of the run identity.
RUN_KEY = 'run'
_CLASS = 'optimizer/{}/class'
_STATE = 'optimizer/{}/state'


def new_run_id():
    """Return a fresh run identity (random, 32 hex digits)."""
    return uuid.uuid4().hex


def _updater_of(obj):
    if isinstance(obj, chainer.training.Trainer):
        return obj.updater, 'updater/'
    if hasattr(obj, 'get_all_optimizers'):
        return obj, ''
    return None, ''


def optimizers_of(obj):
    """Return ``{name: (key prefix of its state, actual optimizer)}`` of ``obj``'s updater."""
    updater, base = _updater_of(obj)
    if updater is None:
        return {}
    out = {}
    for name, opt in sorted(updater.get_all_optimizers().items()):
        actual = getattr(opt, 'actual_optimizer', opt)   # the multi-node optimizer's wrapped one
        out[name] = ('{}optimizer:{}/'.format(base, name), actual)
    return out


def models_of(obj):
    """Return ``[(key prefix, model)]`` of the optimizers' targets in a snapshot of ``obj``.

    None when ``obj`` has no updater (a Link or another object: all of it is the model).
    """
    updater, base = _updater_of(obj)
    if updater is None:
        return None
    return [('{}model:{}/'.format(base, name), opt.target)
            for name, opt in sorted(updater.get_all_optimizers().items())]


def _class_name(opt):
    cls = type(opt)
    return '{}.{}'.format(cls.__module__, cls.__qualname__)


def state_keys(opt):
    """Return the sorted names of the per-parameter state of ``opt`` (``['m', 'v']`` for Adam).

    Taken from a parameter's state when it has one, else from a copy of its update rule
    initialized on a one-element array (the parameter's own rule is not touched).
    """
    target = getattr(opt, 'target', None)
    if target is None:
        return []
    for _, param in sorted(target.namedparams()):
        rule = getattr(param, 'update_rule', None)
        if rule is None:
            continue
        if rule.state is not None:
            return sorted(rule.state)
        probe = copy.copy(rule)
        probe._state = {}
        one = numpy.empty(1, dtype=numpy.float32)
        try:
            probe.init_state(chainer.Variable(one, grad=one))
        except Exception:   # a rule that cannot start on a stand-in: its state names stay unknown
            return None
        return sorted(probe._state)
    return []


def optimizer_meta(obj):
    """Return the metadata that names each optimizer of ``obj`` and its state."""
    meta = {}
    for name, (_, opt) in optimizers_of(obj).items():
        meta[_CLASS.format(name)] = _class_name(opt)
        keys = state_keys(opt)
        if keys is not None:
            meta[_STATE.format(name)] = ','.join(keys)
    return meta


def run_of(meta):
    """Return the run identity recorded in ``meta`` (None for a file written without one)."""
    run = meta.get(RUN_KEY) if isinstance(meta, dict) else None
    return str(run) if run is not None else None


def _optimizer_problem(meta, mine):
    for name, want in sorted(mine.items()):
        have = meta.get(_CLASS.format(name))
        if have is None:
            continue   # written without optimizer metadata (an older chainermn)
        have_state = meta.get(_STATE.format(name))
        want_state = want.get(_STATE.format(name))
        if have != want[_CLASS.format(name)] or (have_state is not None and want_state is not None
                                                 and have_state != want_state):
            return ('its optimizer {!r} is {} (state: {}) but this job\'s is {} (state: {}): '
                    'loading it would put one optimizer\'s state into another. Use the optimizer '
                    'that wrote it, or load the model weights only with maybe_load(..., '
                    'weights_only=True)'.format(name, have, have_state or 'none',
                                                want[_CLASS.format(name)], want_state or 'none'))
    return None


def screen(gens, obj, weights_only, rejected):
    """Return the iterations of ``gens`` that must not be loaded, adding why to ``rejected``.

    ``gens`` is ``{iteration: {rank: [(seen_by, meta or (kind, why)), ...]}}`` as every rank
    sees it, so every rank decides the same without communication.
    """
    mine = {}
    for key, value in optimizer_meta(obj).items():
        mine.setdefault(key.split('/')[1], {})[key] = value
    bad = set()
    for it, files in gens.items():
        metas = [(r, m) for r, seen in sorted(files.items()) for _, m in seen if isinstance(m, dict)]
        runs = {}
        for r, m in metas:
            runs.setdefault(run_of(m), set()).add(r)
        if len(runs) > 1:
            bad.add(it)
            rejected.setdefault(it, []).append(
                'its files come from {} different runs ({}): two jobs wrote into this directory '
                'with the same name, so no rank may take its file from it'.format(
                    len(runs), '; '.join('run {} wrote rank(s) {}'.format(
                        run or '(unrecorded)', ','.join(str(r) for r in sorted(ranks)))
                        for run, ranks in sorted(runs.items(), key=lambda x: str(x[0])))))
            continue
        if weights_only or not metas:
            continue
        problem = _optimizer_problem(metas[0][1], mine)
        if problem is not None:
            bad.add(it)
            rejected.setdefault(it, []).append(problem)
    return bad
