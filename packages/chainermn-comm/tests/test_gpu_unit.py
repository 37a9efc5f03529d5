"""CPU-runnable tests of the GPU communicators' pure logic (no CuPy or GPU needed)."""

import ctypes

import numpy
import pytest

from chainermn_comm import COMMUNICATOR_NAMES, CommunicatorUnavailableError, create_communicator
from chainermn_comm import _gpu_support
from chainermn_comm.reduce import dtypes as _dtypes
from chainermn_comm.gpu import GPU_COMMUNICATORS, create_gpu_communicator
from chainermn_comm.gpu import _cuda_aware as ca
from chainermn_comm.gpu import _layout


def test_every_gpu_name_has_a_class():
    assert set(GPU_COMMUNICATORS) == set(COMMUNICATOR_NAMES) - {'naive'}


def test_create_gpu_communicator_rejects_unknown_name():
    with pytest.raises(ValueError, match='unknown GPU communicator'):
        create_gpu_communicator('bogus')


@pytest.mark.skipif(_gpu_support.gpu_available(), reason='this machine has a GPU')
@pytest.mark.parametrize('name', sorted(set(COMMUNICATOR_NAMES) - {'naive'}))
def test_factory_raises_unavailable_without_gpu(name):
    with pytest.raises(CommunicatorUnavailableError, match=name):
        create_communicator(name)


@pytest.mark.parametrize('dtype', [numpy.float16, numpy.float32, numpy.float64, 'float16', None])
def test_valid_grad_dtypes(dtype):
    got = _dtypes.validate_grad_dtype(dtype)
    assert got is None if dtype is None else got == numpy.dtype(dtype)


@pytest.mark.parametrize('dtype', [numpy.int32, 'bogus', numpy.complex64, object])
def test_invalid_grad_dtypes(dtype):
    with pytest.raises(ValueError, match='allreduce_grad_dtype'):
        _dtypes.validate_grad_dtype(dtype)


def test_plan_layout_offsets_and_tiles():
    lay = _layout.plan_layout([5, 0, 20000, 3], align=4, tile=8192)
    assert lay.offsets.tolist() == [0, 5, 5, 20005]
    assert lay.total == 20008 and lay.padded == 20008
    assert lay.tiles.tolist() == [[0, 0, 5, 0], [2, 0, 8192, 5], [2, 8192, 8192, 8197],
                                  [2, 16384, 3616, 16389], [3, 0, 3, 20005]]


def test_plan_layout_tiles_cover_every_element_once():
    rng = numpy.random.RandomState(0)
    sizes = rng.randint(0, 50000, size=160).tolist()
    lay = _layout.plan_layout(sizes, align=3, tile=1000)
    cover = numpy.zeros(lay.total, numpy.int64)
    for a, st, ln, o in lay.tiles:
        assert 0 < ln <= 1000 and st + ln <= sizes[a]
        assert o == lay.offsets[a] + st
        cover[o:o + ln] += 1
    assert (cover == 1).all()
    assert lay.padded % 3 == 0 and lay.total <= lay.padded < lay.total + 3


def test_plan_layout_empty_and_errors():
    lay = _layout.plan_layout([], align=2)
    assert lay.total == 0 and lay.padded == 2 and lay.tiles.shape == (0, 4)
    with pytest.raises(ValueError):
        _layout.plan_layout([-1])
    with pytest.raises(ValueError):
        _layout.padded_size(10, 0)
    assert _layout.padded_size(10, 4) == 12 and _layout.padded_size(12, 4) == 12


def test_rank_position():
    hosts = ('b', 'b', 'a', 'a', 'b', 'c')
    assert [_layout.rank_position(hosts, r) for r in range(6)] == [
        (0, 0), (0, 1), (1, 0), (1, 1), (0, 2), (2, 0)]


@pytest.mark.parametrize('src,dst', [('float32', 'float16'), ('float16', 'float32'),
                                     ('float32', 'float64'), ('float64', 'float16'),
                                     ('float32', 'float32')])
@pytest.mark.parametrize('direction', ['pack', 'unpack'])
def test_kernel_source(src, dst, direction):
    code, name = _layout.pack_kernel_source(src, dst, direction)
    assert name == 'chainermn_{}_{}_{}'.format(direction, src, dst)
    assert 'extern "C" __global__ void {}('.format(name) in code
    assert code.count('{') == code.count('}')
    work = 'double' if 'float64' in (src, dst) else 'float'
    assert '({})scale'.format(work) in code
    if 'float16' in (src, dst):
        assert 'chainermn_f2h' in code or 'chainermn_h2f' in code
    if direction == 'pack':
        assert 'buf[o + j] =' in code
    else:
        assert 'arr[st + j] =' in code


def test_kernel_source_rejects_other_dtypes():
    with pytest.raises(ValueError, match='float16, float32 and float64'):
        _layout.pack_kernel_source('int32', 'float32', 'pack')
    with pytest.raises(ValueError, match='direction'):
        _layout.pack_kernel_source('float32', 'float32', 'sideways')


@pytest.mark.parametrize('value,expected', [(None, None), ('', None), (' 1 ', True), ('true', True),
                                            ('0', False), ('off', False)])
def test_parse_override(value, expected):
    assert ca.parse_override(value) is expected


def test_parse_override_rejects_garbage():
    with pytest.raises(ValueError, match=ca.CUDA_AWARE_ENV):
        ca.parse_override('maybe')


def test_decide_order():
    env = {ca.CUDA_AWARE_ENV: '1'}
    assert ca.decide(env, 'MPICH', (False, 'q'))[0] is True
    assert ca.decide({ca.CUDA_AWARE_ENV: '0'}, 'Open MPI', (True, 'q'))[0] is False
    ok, why = ca.decide({}, 'Open MPI v5', (True, 'MPIX_Query_cuda_support()'))
    assert ok is True and 'MPIX_Query_cuda_support' in why
    assert ca.decide({'MV2_USE_CUDA': '1'}, 'MVAPICH2 2.3', (None, None))[0] is True
    assert ca.decide({}, 'MVAPICH2 2.3', (None, None))[0] is False
    assert ca.decide({'I_MPI_OFFLOAD': '1'}, 'Intel(R) MPI Library 2021', (None, None))[0] is True
    ok, why = ca.decide({}, 'Some MPI', (None, None))
    assert ok is False and ca.CUDA_AWARE_ENV in why


class _FakeLib:
    def __init__(self, **fns):
        for k, v in fns.items():
            setattr(self, k, v)


def test_query_library_variants():
    assert ca.query_library(None) == (None, None)
    assert ca.query_library(_FakeLib()) == (None, None)

    class Fn:
        def __init__(self, ret, out=None):
            self.ret, self.out = ret, out

        def __call__(self, *args):
            if args:
                ctypes.cast(args[1], ctypes.POINTER(ctypes.c_int))[0] = self.out
            return self.ret

    assert ca.query_library(_FakeLib(MPIX_Query_cuda_support=Fn(1)))[0] is True
    assert ca.query_library(_FakeLib(MPIX_GPU_query_support=Fn(0, 0)))[0] is False
    assert ca.query_library(_FakeLib(MPIX_GPU_query_support=Fn(0, 1)))[0] is True
    assert ca.query_library(_FakeLib(MPIX_GPU_query_support=Fn(1, 1))) == (None, None)


def test_detect_on_this_mpi(monkeypatch):
    monkeypatch.setenv(ca.CUDA_AWARE_ENV, '0')
    assert ca.detect_cuda_aware(refresh=True)[0] is False
    monkeypatch.setenv(ca.CUDA_AWARE_ENV, '1')
    assert ca.detect_cuda_aware(refresh=True)[0] is True
    monkeypatch.delenv(ca.CUDA_AWARE_ENV)
    ok, why = ca.detect_cuda_aware(refresh=True)
    assert isinstance(ok, bool) and why
    if not _gpu_support.gpu_available():
        assert ok is False  # a CPU-only MPICH wheel must not claim CUDA support
