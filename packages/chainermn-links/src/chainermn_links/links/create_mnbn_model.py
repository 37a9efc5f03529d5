"""create_mnbn_model: copy a model with every BatchNormalization its forward pass reaches made multi-node."""

import copy
import types
import warnings

import chainer
import numpy
from chainermn_comm import CommunicatorBase

from chainermn_links.links import _model_graph
from chainermn_links.links.batch_normalization import MultiNodeBatchNormalization, select_backend

__all__ = ['create_mnbn_model', 'ModelConversionWarning']

_BN = chainer.links.BatchNormalization
_MAX_LISTED = 8


class ModelConversionWarning(UserWarning):
    """A BatchNormalization that :func:`create_mnbn_model` found but could not convert."""


def _convert(bn, comm, backend, where):
    """Return a MultiNodeBatchNormalization with ``bn``'s settings, parameters and running statistics."""
    if getattr(bn, 'axis', None) is not None:
        raise ValueError('rank {}: create_mnbn_model cannot convert {} (BatchNormalization(axis={})); '
                         'only the default channel layout (axis=None) is supported'.format(
                             comm.rank, where, bn.axis))
    if bn.avg_mean is None:
        raise ValueError('rank {}: create_mnbn_model cannot convert {}: the BatchNormalization has no size '
                         'yet (it is initialised by its first call); give it a size, or run one forward '
                         'pass before create_mnbn_model'.format(comm.rank, where))
    size = tuple(bn.avg_mean.shape)
    use_gamma = isinstance(getattr(bn, 'gamma', None), chainer.Parameter)
    use_beta = isinstance(getattr(bn, 'beta', None), chainer.Parameter)
    new = MultiNodeBatchNormalization(size, comm, decay=bn.decay, eps=bn.eps,
                                      dtype=numpy.dtype(bn.avg_mean.dtype), use_gamma=use_gamma,
                                      use_beta=use_beta, communication_backend=backend)
    new.to_device(bn.device)
    new.avg_mean[...] = bn.avg_mean
    new.avg_var[...] = bn.avg_var
    new.N = bn.N
    if use_gamma and bn.gamma.array is not None:
        new.gamma.array[...] = bn.gamma.array
    if use_beta and bn.beta.array is not None:
        new.beta.array[...] = bn.beta.array
    new.name = bn.name
    return new


class _Survey(_model_graph.Visitor):
    """Record what the original model holds: the objects walked, communicators and Sequentials."""

    def __init__(self):
        self.ids = set()
        self.comms = {}
        self.sequentials = []

    def replacement(self, obj, path):
        if isinstance(obj, CommunicatorBase):
            self.comms[id(obj)] = obj
        return obj

    def enter(self, obj, path):
        self.ids.add(id(obj))
        if isinstance(obj, chainer.Sequential):
            self.sequentials.append(obj)
        # A function is never copied: what its closure holds is the original's, not the copy's.
        return not isinstance(obj, types.FunctionType)


class _Inspect(_model_graph.Visitor):
    """Read-only walk of an object the copy shares with the original: find links it reaches."""

    def __init__(self, report):
        self.report = report

    def enter(self, obj, path):
        if id(obj) in self.report.original_links:
            self.report.stale.setdefault(id(obj), (path, self.report.original_links[id(obj)], obj))
            return False
        if isinstance(obj, _BN):
            self.report.unconverted.setdefault(id(obj), path)
            return False
        return True


class _Convert(_model_graph.Visitor):
    """Hold the converted links wherever the copy held the old ones; note what cannot be converted."""

    def __init__(self, converted, shared_ids, original_links):
        self.converted = converted
        self.shared_ids = shared_ids
        self.original_links = original_links
        self.stale = {}          # id -> (path, name in the original, link): original links the copy reaches
        self.unconverted = {}    # id -> path: BatchNormalizations that are not registered in the model

    def replacement(self, obj, path):
        return self.converted.get(id(obj), obj)

    def enter(self, obj, path):
        if id(obj) in self.shared_ids:
            # deepcopy did not copy it (a function, or an object that copies to itself): whatever it
            # reaches belongs to the original model, so nothing in it can be redirected.
            _model_graph.walk(obj, _Inspect(self), path)
            return False
        if isinstance(obj, _BN):   # registered ones were replaced before they got here
            self.unconverted.setdefault(id(obj), path)
            return False
        return True


def _listed(items):
    items = list(items)
    text = ', '.join(items[:_MAX_LISTED])
    if len(items) > _MAX_LISTED:
        text += ' and {} more'.format(len(items) - _MAX_LISTED)
    return text


def _describe(name, link):
    if name == '/':
        return 'the original model itself ({})'.format(type(link).__name__)
    return 'the original model\'s link {!r} ({})'.format(name, type(link).__name__)


def _report(visitor, comm):
    if visitor.stale:
        raise ValueError(
            'rank {}: create_mnbn_model copies the model, but the copy reaches links of the original '
            'model through something that deepcopy shares instead of copying (a function\'s closure '
            'or default argument): {}. The converted model would run the original\'s links (its '
            'BatchNormalizations unconverted, its parameters not the ones the optimizer trains). Reach '
            'the links through the model instead: a method, a registered child, or a Sequential layer '
            'that is the link itself (not a lambda that captures it).'.format(comm.rank, _listed(
                '{} holds {}'.format(path, _describe(name, link))
                for path, name, link in visitor.stale.values())))
    if visitor.unconverted:
        warnings.warn(
            'rank {}: create_mnbn_model left {} BatchNormalization(s) unconverted because the model '
            'does not register them as links (they are held by a plain attribute, a container or a '
            'closure): {}. If the forward pass calls them, they normalise with this rank\'s batch only '
            'and no optimizer sees their parameters; register them (inside init_scope(), or with '
            'add_link) before calling create_mnbn_model.'.format(
                comm.rank, len(visitor.unconverted), _listed(visitor.unconverted.values())),
            ModelConversionWarning, stacklevel=3)


def _deepcopy(link, survey, comm):
    """Deep-copy ``link`` sharing its communicators; copy Sequentials even when they hold lambdas."""
    memo = {id(comm): comm}
    memo.update(survey.comms)
    shells = []
    for seq in survey.sequentials:
        # Sequential refuses pickling (and so deepcopy) when a layer is a lambda; copy its state
        # here instead, sharing the functions as deepcopy does.
        shell = type(seq).__new__(type(seq))
        memo[id(seq)] = shell
        shells.append((seq, shell))
    new = copy.deepcopy(link, memo)
    for seq, shell in shells:
        shell.__dict__.update(copy.deepcopy(seq.__dict__, memo))
    return new


def create_mnbn_model(link, comm, communication_backend='auto'):
    """Return a deep copy of ``link`` with every ``chainer.links.BatchNormalization`` it registers replaced.

    Each registered BatchNormalization (an attribute of a ``Chain``, a child of a ``ChainList``,
    a layer of a ``Sequential``, at any depth, or ``link`` itself) becomes one
    :class:`MultiNodeBatchNormalization` with the same size, decay, eps, dtype, gamma/beta use,
    parameters and running statistics, and every place of the copy that held it holds the new
    link: the ``Sequential``'s list of layers as well as its children, plain lists, dicts and
    tuples, bound methods and partials.  A link held in several places is converted once.  The
    original is not modified; communicators are shared, not copied.

    Raises ValueError when the copy would still run links of the original (a function's closure
    holds them), and warns (:class:`ModelConversionWarning`) about BatchNormalizations the model
    holds without registering them, which stay as they are.
    """
    if not isinstance(link, chainer.Link):
        raise TypeError('rank {}: create_mnbn_model needs a chainer.Link (a Chain, ChainList, Sequential '
                        'or BatchNormalization); got {}'.format(comm.rank, type(link).__name__))
    select_backend(comm, communication_backend)
    survey = _Survey()
    _model_graph.walk(link, survey)
    new = _deepcopy(link, survey, comm)
    converted = {}
    for name, child in new.namedlinks():
        if isinstance(child, _BN) and id(child) not in converted:
            converted[id(child)] = _convert(child, comm, communication_backend, 'link ' + repr(name))
    original_links = {id(child): name for name, child in link.namedlinks()}
    visitor = _Convert(converted, survey.ids, original_links)
    new = _model_graph.walk(new, visitor)
    _report(visitor, comm)
    return new
