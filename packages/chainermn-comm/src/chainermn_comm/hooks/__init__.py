"""Communication hooks: plug-ins that average a model's gradients over ranks (``chainermn.hooks``).

``create_multi_node_optimizer(optimizer, comm, comm_hook=HOOK)`` averages every update's
gradients with ``HOOK`` (with ``overlap=True``, each bucket).  The built-in hooks:

- :class:`Exact`, :class:`Float16`, :class:`BFloat16`, :class:`Auto`: today's wires
  (``allreduce_grad_dtype`` None, ``numpy.float16``, ``'bfloat16'``, ``'auto'``), the same bits;
- :class:`PowerSGD`: low-rank compression with error feedback (Vogels et al., 2019).

A hook of your own subclasses :class:`CommHook` (or is a function ``fn(comm, bucket)``) and
averages with :func:`mean`; see ``docs/communicators.md``, "Communication hooks".
"""

from chainermn_comm.hooks.auto import Auto
from chainermn_comm.hooks.base import RANK_MEAN, CommHook, FunctionHook, GradBucket, WireHook, mean
from chainermn_comm.hooks.bfloat16 import BFloat16
from chainermn_comm.hooks.exact import Exact
from chainermn_comm.hooks.float16 import Float16
from chainermn_comm.hooks.powersgd import PowerSGD
from chainermn_comm.hooks.resolve import from_grad_dtype, resolve
from chainermn_comm.hooks.run import mean_model

__all__ = ['CommHook', 'GradBucket', 'WireHook', 'FunctionHook', 'Exact', 'Float16', 'BFloat16', 'Auto',
           'PowerSGD', 'mean', 'resolve', 'from_grad_dtype', 'mean_model', 'RANK_MEAN']
