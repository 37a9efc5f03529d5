"""The power of two that float16 averages scale by (``reduce.half.local_exponents``, ``factors``), and two ranks' one phase."""

import math

import numpy
import pytest

from chainermn_comm.reduce import codecs as _codecs
from chainermn_comm.reduce import half as _half


def test_exponent_puts_the_largest_value_just_below_the_top():
    arrays = [numpy.array([3.0, -1.0], numpy.float32), numpy.array([-5e-8, 1e-9], numpy.float32),
              numpy.array([40000.0], numpy.float16), numpy.array([2.0 ** 13], numpy.float32)]
    for a, e in zip(arrays, _half.local_exponents(arrays)):
        top = float(numpy.abs(a.astype(numpy.float64)).max()) * 2.0 ** int(e)
        assert 2.0 ** (_half.TOP_EXP - 1) <= top < 2.0 ** _half.TOP_EXP, (a, e)


def test_zeros_empty_and_non_finite_arrays():
    arrays = [numpy.zeros(4, numpy.float32), numpy.empty(0, numpy.float32),
              numpy.array([1.0, numpy.nan], numpy.float32), numpy.array([-numpy.inf], numpy.float32),
              numpy.array([1e-38], numpy.float32), numpy.array([3e38], numpy.float32)]
    assert _half.local_exponents(arrays).tolist() == [
        _half.MAX_EXP, _half.MAX_EXP, 0, 0, _half.MAX_EXP, _half.MIN_EXP]


def test_factors_are_exact_powers_of_two_times_the_scale():
    ups, downs = _half.factors(numpy.array([0, 12, -20], numpy.int32), 1.0 / 3)
    assert ups == [1.0 / 3, math.ldexp(1.0 / 3, 12), math.ldexp(1.0 / 3, -20)]
    assert downs == [1.0, 2.0 ** -12, 2.0 ** 20]
    assert numpy.float32(ups[1]) == numpy.float32(1.0 / 3) * numpy.float32(4096)


def test_two_ranks_take_one_phase_and_keep_the_float32_sum():
    assert _half.one_phase(2) and not _half.one_phase(3) and not _half.one_phase(1)
    terms = numpy.array([[1.0, 2.0 ** -9, -3.0], [2.0 ** -9, 1.0, 3.0]], numpy.float32)
    parts = numpy.empty(terms.size, numpy.uint16)
    _codecs.bf16_encode(parts, terms.reshape(-1))
    out = numpy.empty(3, numpy.float32)
    _half.sum_all(out, parts, _codecs.BFLOAT16, 0.5)
    # 1 + 2**-9 is no bfloat16 (8-bit significand): the sum is kept, not rounded back to 1.
    assert out.tolist() == [(1.0 + 2.0 ** -9) / 2, (1.0 + 2.0 ** -9) / 2, 0.0]
    dst = numpy.empty(3, numpy.float64)
    wide = numpy.empty(2, numpy.float32)  # smaller than the terms: two blocks
    _half.sum_into(dst, [parts[:3], parts[3:]], wide, _codecs.BFLOAT16, 0.5, 4.0)
    assert dst.tolist() == [2.0 + 2.0 ** -8, 2.0 + 2.0 ** -8, 0.0]


class _TwoRanks:
    def Get_size(self):
        return 2

    def Get_rank(self):
        return 0


def test_one_phase_sum_on_a_wire_needs_a_float32_out():
    flight = _half.InFlightSum(_TwoRanks())
    assert flight.one_phase
    with pytest.raises(ValueError, match='needs out= of 4 float32 elements'):
        flight.start(numpy.zeros(4, numpy.uint16), _codecs.BFLOAT16, 0.5)


class _Recorder(_TwoRanks):
    def Iallgather(self, *args):
        self.args = args
        return 'request'


def test_my_block_of_the_copies_is_sent_in_place():
    from mpi4py import MPI
    parts = numpy.zeros(8, numpy.uint16)
    comm = _Recorder()
    assert _half.start_allgather(comm, parts[:4], parts) == 'request'
    assert comm.args[0] is MPI.IN_PLACE  # rank 0's block: no copy into the receive buffer
    _half.start_allgather(comm, numpy.zeros(4, numpy.uint16), parts)
    assert comm.args[0] is not MPI.IN_PLACE
    flight = _half.InFlightSum(comm)
    words = flight.send_view(4, _codecs.BFLOAT16)
    assert words.size == 4 and words.dtype == numpy.uint16
    assert words.__array_interface__['data'][0] == flight._parts.__array_interface__['data'][0]
