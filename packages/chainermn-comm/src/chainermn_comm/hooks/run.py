"""Average a model's gradients through a communication hook, under the communicator's guard."""

__all__ = ['mean_model']


def mean_model(comm, model, hook, zero_fill=True):
    """Average the gradients of ``model`` over the ranks of ``comm`` with ``hook``, in place.

    Like ``comm.multi_node_mean_grad(model, zero_fill)``: parameters without a gradient take
    part with zeros (``zero_fill``), the ranks check that they average the same arrays with
    the same hook, and while tracing the call is a ``comm`` event naming the hook.  ``hook``
    None is the communicator's own ``multi_node_mean_grad``.  One call of the averaging
    interface (:class:`chainermn_comm.averaging.ModelAverage`).
    """
    if hook is None:
        comm.multi_node_mean_grad(model, zero_fill)
        return
    from chainermn_comm.averaging import ModelAverage
    ModelAverage(comm, model, hook, zero_fill).mean()
