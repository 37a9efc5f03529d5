"""Average a model's gradients through a communication hook, under the communicator's guard."""

from chainermn_comm import trace
from chainermn_comm.guard import stable_code
from chainermn_comm.hooks.base import GradBucket
from chainermn_comm.reduce import chunked as _grad
from chainermn_comm.reduce.model_collectives import arrays_traced

__all__ = ['mean_model', 'named_grads']


def named_grads(model, zero_fill):
    """Return ``(params, names)`` of ``model`` that take part in an average, in the order every rank uses."""
    params = _grad.collect_params(model, zero_fill)
    by_id = {id(p): n for n, p in model.namedparams()}
    return params, [by_id[id(p)] for p in params]


def mean_model(comm, model, hook, zero_fill=True):
    """Average the gradients of ``model`` over the ranks of ``comm`` with ``hook``, in place.

    Like ``comm.multi_node_mean_grad(model, zero_fill)``: parameters without a gradient take
    part with zeros (``zero_fill``), the ranks check that they average the same arrays with
    the same hook, and while tracing the call is a ``comm`` event naming the hook.  ``hook``
    None is the communicator's own ``multi_node_mean_grad``.
    """
    if hook is None:
        comm.multi_node_mean_grad(model, zero_fill)
        return
    params, names = named_grads(model, zero_fill)
    guard = getattr(comm, '_guard', None)
    grads_of = getattr(comm, '_grads_of', None)
    if guard is None or grads_of is None:  # a communicator of the user's own: no check
        hook(comm, GradBucket([p.grad for p in params], names))
        return
    label = str(hook)

    def sig():
        return (('params', _grad.params_signature(model, params, 'grad')), ('comm_hook', label))

    shapes, codes = _grad.params_key(params, 'grad')
    traced = None
    if trace.ON:
        wire = hook.wire if hook.is_wire else None
        traced = arrays_traced([p.grad for p in params], 'mean',
                               None if isinstance(wire, str) else wire)  # 'auto', 'bfloat16': no dtype
        if isinstance(wire, str) and wire != 'auto':
            traced['wire_dtype'] = wire
        traced['hook'] = label
    with guard('allreduce_grad', sig, key=(shapes, codes, stable_code(label)), traced=traced):
        hook(comm, GradBucket(grads_of(params), names))
