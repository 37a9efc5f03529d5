"""Map NumPy dtypes and reduction names to MPI for collective calls."""

import numpy

from chainermn_comm import spelling

__all__ = ['reduction_op', 'check_numeric', 'REDUCE_OPS', 'GRAD_DTYPE_NAMES', 'validate_grad_dtype']

REDUCE_OPS = ('sum', 'max', 'min', 'prod')
#: The names ``allreduce_grad_dtype`` accepts as strings, and spellings users type for them.
GRAD_DTYPE_NAMES = ('float16', 'float32', 'float64', 'bfloat16', 'auto')
_GRAD_DTYPE_ALIASES = {'fp16': 'float16', 'fp32': 'float32', 'fp64': 'float64', 'bf16': 'bfloat16'}


def reduction_op(op):
    """Return the ``MPI.Op`` for ``op`` (``'sum'``, ``'max'``, ``'min'``, ``'prod'`` or an ``MPI.Op``)."""
    from mpi4py import MPI
    if isinstance(op, MPI.Op):
        return op
    table = {'sum': MPI.SUM, 'max': MPI.MAX, 'min': MPI.MIN, 'prod': MPI.PROD}
    try:
        return table[str(op).lower()]
    except KeyError:
        raise ValueError('unsupported reduction op {!r}.{} Use one of {}'.format(
            op, spelling.did_you_mean(op, REDUCE_OPS), ', '.join(REDUCE_OPS)))


def check_numeric(array, what, rank, op='sum'):
    """Raise TypeError unless ``array`` has a numeric dtype MPI can reduce with ``op``."""
    kind = array.dtype.kind
    if kind not in 'iufc':
        raise TypeError('rank {}: {} needs a numeric array (int, uint, float, complex); got dtype {} '
                        'with shape {}'.format(rank, what, array.dtype, array.shape))
    if kind == 'c' and isinstance(op, str) and op.lower() in ('max', 'min'):
        raise TypeError('rank {}: {} with op={!r} is undefined for complex dtype {} (shape {}); '
                        'use sum or prod, or reduce the real and imaginary parts separately'.format(
                            rank, what, op, array.dtype, array.shape))


def validate_grad_dtype(dtype):
    """Return ``dtype`` as a float numpy dtype, ``'bfloat16'``, ``'auto'`` or None; else raise ValueError.

    ``'bfloat16'`` (or ``ml_dtypes.bfloat16`` where ml_dtypes is installed) is a 16-bit wire
    carried as uint16 words (``reduce.codecs``); ``'auto'`` lets the tuner choose among float32,
    float16 and bfloat16 (``reduce.tune``).
    """
    if dtype is None:
        return None
    if isinstance(dtype, str) and dtype.strip().lower() == 'auto':
        return 'auto'
    from chainermn_comm.reduce import codecs as _codecs
    if _codecs.is_bfloat16(dtype):
        return _codecs.BFLOAT16_NAME
    try:
        dt = numpy.dtype(dtype)
    except TypeError:
        dt = None
    if dt is None or dt.kind != 'f' or dt.itemsize not in (2, 4, 8):
        hint = spelling.did_you_mean(dtype, GRAD_DTYPE_NAMES, _GRAD_DTYPE_ALIASES)
        raise ValueError('allreduce_grad_dtype must be None, numpy.float16, numpy.float32, numpy.float64, '
                         "'bfloat16' (or ml_dtypes.bfloat16) or 'auto'; got {!r}.{}".format(dtype, hint))
    return dt
