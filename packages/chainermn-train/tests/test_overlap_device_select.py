"""Which gradients take the side-stream path (device_group), checked with stand-ins for CuPy and NCCL."""

import sys
import types

import numpy
import pytest

from chainermn_train import _overlap_device


class _Array:
    def __init__(self, dtype, device):
        self.dtype = numpy.dtype(dtype)
        self.device = types.SimpleNamespace(id=device)


class _Param:
    def __init__(self, dtype='float32', device=0):
        self.array = _Array(dtype, device)


class _Group:
    def __init__(self, size):
        self.size = size


class _Comm:
    def __init__(self, size=2, group_size=2, grad_dtype=None, nccl=True):
        self.size = size
        self.allreduce_grad_dtype = grad_dtype
        # The communicator's averaging interface names its NCCL group (None: it has none).
        self.averaging = types.SimpleNamespace(nccl=_Group(group_size) if nccl else None)


@pytest.fixture
def fake_cupy(monkeypatch):
    cupy = types.ModuleType('cupy')
    cupy.ndarray = _Array
    cuda = types.ModuleType('cupy.cuda')
    nccl = types.ModuleType('cupy.cuda.nccl')
    for i, name in enumerate(['INT8', 'UINT8', 'INT32', 'UINT32', 'INT64', 'UINT64', 'FLOAT16',
                              'FLOAT32', 'FLOAT64']):
        setattr(nccl, 'NCCL_' + name, i)
    cuda.nccl = nccl
    cupy.cuda = cuda
    for name, mod in (('cupy', cupy), ('cupy.cuda', cuda), ('cupy.cuda.nccl', nccl)):
        monkeypatch.setitem(sys.modules, name, mod)
    return cupy


def test_takes_the_side_stream_path(fake_cupy):
    comm = _Comm()
    assert _overlap_device.device_group(comm, [_Param(), _Param()]) is comm.averaging.nccl
    assert _overlap_device.device_group(_Comm(grad_dtype=numpy.float32), [_Param()]) is not None
    assert _overlap_device.device_group(_Comm(), [_Param('float16')]) is not None


@pytest.mark.parametrize('comm, params', [
    (_Comm(nccl=False), [_Param()]),                                   # no NCCL group (e.g. flat)
    (_Comm(size=4, group_size=2), [_Param()]),                          # NCCL only within a node
    (_Comm(), []),                                                      # no parameters
    (_Comm(), [_Param('float32'), _Param('float64')]),                  # two dtypes
    (_Comm(), [_Param(device=0), _Param(device=1)]),                    # two devices
    (_Comm(grad_dtype=numpy.float16), [_Param('float32')]),             # reduced in another dtype
    (_Comm(), [_Param('complex64')]),                                   # NCCL cannot sum it
])
def test_takes_another_path(fake_cupy, comm, params):
    assert _overlap_device.device_group(comm, params) is None


def test_host_arrays_never_take_it(fake_cupy):
    p = _Param()
    p.array = numpy.zeros(3, numpy.float32)
    assert _overlap_device.device_group(_Comm(), [p]) is None


def test_layout_checksum_ignores_the_device_id():
    """Ranks compare layout checksums; each rank has its own GPU, so the id must not count."""
    from chainermn_train import _overlap

    class P:
        def __init__(self, shape):
            self.array = numpy.zeros(shape, numpy.float32)

    params = [P((3, 2)), P((2,))]
    base = ('<f4', (1, 0), ((3, 2), (2,)))
    crcs = {_overlap._Layout(base + ('device', dev), params, [1, 0], numpy.dtype('float32'), 8).crc
            for dev in (0, 1, 7)}
    assert len(crcs) == 1
    other = _overlap._Layout(('<f4', (0, 1), ((3, 2), (2,))), params, [0, 1], numpy.dtype('float32'), 8)
    assert other.crc not in crcs  # a different order still differs
