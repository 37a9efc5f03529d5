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


def pseudo_connect(delegate_variable, *actual_variables):
    """Return ``actual_variables`` unchanged but connected to ``delegate_variable`` in the graph.

    Backward through the result first reaches everything that produced ``actual_variables`` and
    then (with a zero gradient) ``delegate_variable``, e.g. the delegate returned by an earlier
    :func:`send`, so that send's backward runs too.  Returns one Variable for one actual
    variable, else a tuple.  With no actual variables the delegate itself is returned.
    """
    if delegate_variable is None:
        raise TypeError('pseudo_connect needs a delegate variable (e.g. the output of functions.send); got None')
    delegates = _util.as_variable_tuple(delegate_variable, 'pseudo_connect (delegate_variable)')
    if not actual_variables:
        return delegates[0] if len(delegates) == 1 else delegates
    actuals = _util.as_variable_tuple(actual_variables, 'pseudo_connect (actual_variables)')
    ys = PseudoConnect(len(delegates)).apply(delegates + actuals)
    if len(ys) == 1:
        return ys[0]
    return tuple(ys)
