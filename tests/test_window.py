import pytest

from mpirl.window import InflightWindow


def test_fixed():
    assert InflightWindow(1).size == 1 and InflightWindow(7).size == 7
    with pytest.raises(ValueError, match="inflight=0"):
        InflightWindow(0)


def test_auto_littles_law():
    w = InflightWindow(smoothing=1.0)
    assert w.size == 2
    # 60 ms round trip on the wire, 5 ms per update -> 12 updates fit in the trip, +1 in training
    w.observe(rtt_total=0.060 + 0.010 + 0.002, hold=0.010, queue_wait=0.002, step=0.005)
    assert w.size == 13
    # a fast local link: one in flight plus one being trained is enough
    w.observe(rtt_total=0.0002, hold=0.0001, queue_wait=0.0, step=0.005)
    assert w.size == 2


def test_auto_follows_a_link_change_and_is_bounded():
    w = InflightWindow(max_window=16)
    for _ in range(50):
        w.observe(0.001, 0.0, 0.0, 0.004)
    small = w.size
    for _ in range(50):
        w.observe(0.060, 0.0, 0.0, 0.004)
    assert small <= 2 and w.size == 16
    for _ in range(50):
        w.observe(0.020, 0.0, 0.0, 0.004)
    assert 6 <= w.size <= 7
