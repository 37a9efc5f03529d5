"""The training loop's trace events (``chainermn_comm.trace``), one call per instrumented place.

Each helper costs one check of ``trace.ON`` when tracing is off.
"""

import numpy

from chainermn_comm import trace

__all__ = ['on_device', 'backward', 'bucket_args', 'bucket_name']


def on_device(params):
    """Return True when the first of ``params`` lives on a CUDA device (timed with CUDA events)."""
    return bool(params) and not isinstance(params[0].array, numpy.ndarray)


def backward(loss, kwargs, device):
    """Run ``loss.backward(**kwargs)``; while tracing it is the 'compute' event 'backward'."""
    if not trace.ON:
        return loss.backward(**kwargs)
    started = trace.begin(device)
    loss.backward(**kwargs)
    trace.end(started, 'backward', 'compute')
    return None


def bucket_name(first, last=None):
    """Return the event name of buckets ``first`` to ``last``: 'bucket B' (or 'bucket B-L')."""
    if last is None or last == first:
        return 'bucket {}'.format(first)
    return 'bucket {}-{}'.format(first, last)


def bucket_args(grads, wire_dtype, call):
    """Return the 'comm' arguments of a bucket average of the arrays ``grads``."""
    dtypes = {g.dtype for g in grads}
    dtype = dtypes.pop().name if len(dtypes) == 1 else ('mixed' if dtypes else '')
    args = {'bytes': int(sum(g.nbytes for g in grads)), 'dtype': dtype, 'op': 'mean',
            'call': int(call), 'grad': True}
    if wire_dtype is not None and numpy.dtype(wire_dtype).name != dtype:
        args['wire_dtype'] = numpy.dtype(wire_dtype).name
    return args
