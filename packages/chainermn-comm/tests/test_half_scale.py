"""The power of two that float16 averages scale by (``_half.local_exponents``, ``factors``)."""

import math

import numpy

from chainermn_comm import _half


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
