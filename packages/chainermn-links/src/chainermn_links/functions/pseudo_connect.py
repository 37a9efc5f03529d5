"""pseudo_connect: make variables depend on a delegate variable without changing their values."""

import chainer
from chainer import function_node

from chainermn_links.functions import _util

__all__ = ['pseudo_connect', 'PseudoConnect']


class PseudoConnect(function_node.FunctionNode):
    """Return the actual inputs unchanged; give the delegate inputs zero gradients."""

    def __init__(self, n_delegates):
        self.n_delegates = n_delegates

    def forward(self, inputs):
        self._delegate_specs = [_util.spec(d) for d in inputs[:self.n_delegates]]
        return tuple(inputs[self.n_delegates:])

    def backward(self, target_input_indexes, grad_outputs):
        gds = tuple(chainer.Variable(_util.zeros_like_spec(s)) for s in self._delegate_specs)
        return gds + tuple(grad_outputs)


class _ConnectedVariable(chainer.Variable):
    """The one result of ``pseudo_connect``: a Variable that also unpacks as a one-element tuple.

    The reference returns a Variable (``y = pseudo_connect(d, x)``); Chainer v7's chainermn
    returns a one-element tuple (``y, = pseudo_connect(d, x)``).  Iterating this Variable
    yields itself once, so both spellings give the same Variable.  (Iterating a plain
    Variable yields its rows, and nothing at all for a 0-dim one such as a loss.)
    """

    def __iter__(self):
        return iter((self,))


def pseudo_connect(delegate_variable, *actual_variables):
    """Return ``actual_variables`` unchanged but connected to ``delegate_variable`` in the graph.

    Backward through the result first reaches everything that produced ``actual_variables`` and
    then (with a zero gradient) ``delegate_variable``, e.g. the delegate returned by an earlier
    :func:`send`, so that send's backward runs too.  Returns one Variable for one actual
    variable (it also unpacks as a one-element tuple, as Chainer v7's result does), else a
    tuple.  With no actual variables the delegate itself is returned.  A ``delegate_variable``
    of None (e.g. the delegate of a link that sends nothing) connects to nothing.
    """
    if delegate_variable is None:
        if not actual_variables:
            raise TypeError('pseudo_connect needs a delegate variable (e.g. the output of functions.send) '
                            'or actual variables; got None and nothing else')
        delegates = ()
    else:
        delegates = _util.as_variable_tuple(delegate_variable, 'pseudo_connect (delegate_variable)')
    if not actual_variables:
        return delegates[0] if len(delegates) == 1 else delegates
    actuals = _util.as_variable_tuple(actual_variables, 'pseudo_connect (actual_variables)')
    ys = PseudoConnect(len(delegates)).apply(delegates + actuals)
    if len(ys) == 1:
        y = ys[0]
        # Same object (the graph keeps a weak reference to it); only iteration changes.
        y.__class__ = _ConnectedVariable
        return y
    return tuple(ys)
