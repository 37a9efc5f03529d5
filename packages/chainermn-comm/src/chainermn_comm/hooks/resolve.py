"""Turn what a user passes as ``comm_hook`` (or ``allreduce_grad_dtype``) into a hook object."""

import numpy

from chainermn_comm.hooks.auto import Auto
from chainermn_comm.hooks.base import CommHook, FunctionHook, WireHook
from chainermn_comm.hooks.bfloat16 import BFloat16
from chainermn_comm.hooks.exact import Exact
from chainermn_comm.hooks.float16 import Float16
from chainermn_comm.reduce import dtypes as _dtypes

__all__ = ['resolve', 'from_grad_dtype']


def from_grad_dtype(grad_dtype):
    """Return the built-in hook that averages as ``allreduce_grad_dtype=grad_dtype`` does."""
    wire = _dtypes.validate_grad_dtype(grad_dtype)
    if wire is None:
        return Exact()
    if isinstance(wire, str):
        return Auto() if wire == 'auto' else BFloat16()
    if wire.itemsize == 2:
        return Float16()
    return WireHook(wire)  # float32 or float64 on the wire, whatever the gradients' dtype


def resolve(comm_hook):
    """Return ``comm_hook`` as a :class:`CommHook`, or None for the communicator's own wire.

    Accepts None, a :class:`CommHook`, a function ``fn(comm, bucket)``, or an
    ``allreduce_grad_dtype`` value (``numpy.float16``, ``'bfloat16'``, ``'auto'``, ...).
    """
    if comm_hook is None or isinstance(comm_hook, CommHook):
        return comm_hook
    if isinstance(comm_hook, type) and issubclass(comm_hook, CommHook):
        raise TypeError('comm_hook got the class {0}; pass an instance ({0}())'.format(comm_hook.__name__))
    if isinstance(comm_hook, (str, type, numpy.dtype)):
        return from_grad_dtype(comm_hook)  # ValueError names the values allowed
    if not callable(comm_hook):
        raise TypeError('comm_hook must be a chainermn.hooks.CommHook, a function fn(comm, bucket), '
                        'an allreduce_grad_dtype value or None; got {!r}'.format(comm_hook))
    return FunctionHook(comm_hook)
