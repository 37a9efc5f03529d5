"""The pause of paced polite waits follows the fastest rate seen, within its bounds."""

import pytest

from chainermn_comm.reduce import stream as _stream


def test_a_new_pacer_tests_as_often_as_a_polite_wait():
    assert _stream.Pacer().pause() == _stream.POLITE_PAUSE


@pytest.mark.parametrize('rate,want', [
    (125e6, _stream.MAX_PAUSE),                    # 1 Gbit/s: 64 KiB take 0.52 ms, capped
    (1.25e9, _stream.POLL_BYTES / 1.25e9),         # 10 Gbit/s: 52 us
    (1e12, _stream.POLITE_PAUSE),                  # faster than any link: the floor
])
def test_pause_lets_about_poll_bytes_through_between_tests(rate, want):
    p = _stream.Pacer()
    p.observe(rate, 1.0)
    assert p.pause() == pytest.approx(want)


def test_rate_only_ratchets_up():
    p = _stream.Pacer()
    p.observe(1.25e9, 1.0)
    fast = p.pause()
    p.observe(1e6, 1.0)  # a call that waited for a late rank says nothing about the link
    p.observe(0, 0.0)
    assert p.pause() == fast
    p.observe(2.5e9, 1.0)
    assert p.pause() == pytest.approx(fast / 2)
