"""AllreducePersistent: average float persistent values (e.g. BN running statistics) over ranks."""

import chainer
import numpy

from chainermn_train import _params

__all__ = ['AllreducePersistent']


def _is_float_array(value):
    dtype = getattr(value, 'dtype', None)
    return dtype is not None and numpy.dtype(dtype).kind == 'f' and hasattr(value, 'shape')


class AllreducePersistent(chainer.training.Extension):
    """Trainer extension that replaces every float persistent of ``model`` by its mean over ranks.

    Integer persistents (e.g. the count ``N`` of BatchNormalization) are left alone, as are
    Python ints and bools.  Python float persistents are averaged too.  Values of one dtype are
    packed into one buffer and all-reduced in a single call.

    Args:
        model (chainer.Link): link whose persistents are averaged.
        comm: ChainerMN communicator.
    """

    trigger = 1, 'epoch'
    priority = chainer.training.PRIORITY_WRITER + 1  # before writers and evaluators see the values

    def __init__(self, model, comm):
        self.model = model
        self.comm = comm

    def __call__(self, trainer=None):
        """Average the float persistents over all ranks (a collective: call it on every rank)."""
        groups = {}
        for path, owner, attr, value in _params.iter_persistents(self.model):
            if isinstance(value, bool) or value is None:
                continue
            if _is_float_array(value):
                groups.setdefault(numpy.dtype(value.dtype).str, []).append((owner, attr, value))
            elif isinstance(value, float):
                groups.setdefault('<pyfloat>', []).append((owner, attr, value))
        size = self.comm.size
        for key in sorted(groups):
            items = groups[key]
            if key == '<pyfloat>':
                flat = numpy.array([v for _, _, v in items], dtype=numpy.float64)
            else:
                flat = numpy.concatenate([numpy.asarray(chainer.backend.CpuDevice().send(v)).reshape(-1)
                                          for _, _, v in items])
            total = self.comm.allreduce(flat)
            mean = total / flat.dtype.type(size)
            off = 0
            for owner, attr, value in items:
                if key == '<pyfloat>':
                    setattr(owner, attr, float(mean[off]))
                    off += 1
                    continue
                n = value.size
                part = mean[off:off + n].reshape(value.shape)
                off += n
                if isinstance(value, numpy.ndarray):
                    value[...] = part
                elif isinstance(value, numpy.generic):
                    setattr(owner, attr, value.dtype.type(part))
                else:
                    value[...] = chainer.backend.get_device_from_array(value).send(part)
