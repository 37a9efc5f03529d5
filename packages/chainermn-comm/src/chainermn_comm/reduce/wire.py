"""What travels between ranks for host arrays: headers, byte views, and small local reductions."""

import operator

import numpy

__all__ = ['MAX_PIECE', 'OBJ_OPS', 'FUSED_KINDS', 'ArrayMessage', 'Fail', 'spec', 'as_bytes', 'empty',
           'recv_obj_status_and_tag',
           'raise_if_failed', 'reduce_rows', 'op_name', 'split_into']

#: Largest piece of a point-to-point or broadcast message (portable to MPI-3 libraries).
MAX_PIECE = 1 << 30

OBJ_OPS = {'sum': operator.add, 'max': max, 'min': min, 'prod': operator.mul}


class ArrayMessage:
    """Header sent before the bytes of ``send``: the shapes and dtypes that follow, and which were on a GPU."""

    __slots__ = ('specs', 'is_tuple', 'on_device')

    def __init__(self, specs, is_tuple, on_device=None):
        self.specs = specs
        self.is_tuple = is_tuple
        self.on_device = list(on_device) if on_device is not None else [False] * len(specs)

    def __getstate__(self):
        return (self.specs, self.is_tuple, self.on_device)

    def __setstate__(self, state):
        self.specs, self.is_tuple, self.on_device = state


class Fail:
    """Marker a rank contributes to a header exchange when its own input is invalid."""

    __slots__ = ('message',)

    def __init__(self, message):
        self.message = message

    def __getstate__(self):
        return self.message

    def __setstate__(self, state):
        self.message = state


def spec(a):
    return (a.shape, a.dtype.str)


def as_bytes(a):
    return a.reshape(-1).view(numpy.uint8)


def empty(spec):
    shape, dtype = spec
    return numpy.empty(shape, dtype=numpy.dtype(dtype))


def raise_if_failed(headers, rank, what):
    fails = [(r, h.message) for r, h in enumerate(headers) if isinstance(h, Fail)]
    if fails:
        detail = '; '.join('rank {}: {}'.format(r, m) for r, m in fails)
        raise ValueError('rank {}: {} failed because of invalid input on {}'.format(
            rank, what, detail))


#: Reductions a small all-reduce does itself on the arrays the agreement check gathered, by dtype kind.
FUSED_KINDS = {'sum': 'iufc', 'prod': 'iufc', 'max': 'iuf', 'min': 'iuf'}
FUSED_UFUNCS = {'sum': numpy.add, 'prod': numpy.multiply, 'max': numpy.maximum, 'min': numpy.minimum}


def reduce_rows(rows, out, name):
    """Reduce every rank's array (``rows``, in rank order) into ``out``, in rank order."""
    fn = FUSED_UFUNCS[name]
    fn(rows[0], rows[1], out=out)
    for r in rows[2:]:
        fn(out, r, out=out)


def op_name(op, mpi_op):
    """Return a name for the reduction ``op`` that is the same in every process."""
    if isinstance(op, str):
        return op.lower()
    from mpi4py import MPI
    for name in ('SUM', 'MAX', 'MIN', 'PROD', 'LAND', 'LOR', 'BAND', 'BOR', 'LXOR', 'BXOR'):
        if mpi_op == getattr(MPI, name):
            return name.lower()
    return 'user-defined MPI.Op'


def split_into(recv, counts, outs):
    offset = 0
    for out, n in zip(outs, counts):
        as_bytes(out)[...] = recv[offset:offset + n]
        offset += n
    return outs


def recv_obj_status_and_tag(rank, status, tag):
    """Return ``(status, tag)`` of a ``recv_obj`` call: v7's ``(source, status, tag)`` or ``(source, tag)``.

    An int in the place of ``status`` is the tag; the tag comes back None for any tag.
    """
    from mpi4py import MPI
    if isinstance(status, (int, numpy.integer)) and not isinstance(status, bool):
        if tag is not None:
            raise TypeError('rank {}: recv_obj got the tag twice ({!r} in the place of status, '
                            'and tag={!r}); pass status=mpi4py.MPI.Status() or leave it out'.format(
                                rank, status, tag))
        status, tag = None, status
    if status is not None and not isinstance(status, MPI.Status):
        raise TypeError('rank {}: recv_obj status must be None or an mpi4py.MPI.Status; got {}'.format(
            rank, type(status).__name__))
    if tag is None or (not isinstance(tag, bool) and tag == MPI.ANY_TAG):
        tag = None
    return status, tag
