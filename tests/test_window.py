import pytest

from mpirl.transport.window import InflightWindow


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


def test_auto_is_bounded_by_the_link_on_a_slow_link():
    """CartPole batches at 0.2 Mb/s: 5 kB take 0.2 s on the wire, the learner 5 ms an update.
    The pipeline moves one batch per 0.2 s, so a 0.6 s round trip needs 4 in flight, not the 64
    (12.8 s queued at the buffer, ahead of its STATS and DONE) that the update time alone gives."""
    w = InflightWindow(smoothing=1.0)
    w.observe(rtt_total=0.6, hold=0.0, queue_wait=0.0, step=0.005, tx=0.2)
    assert w.size == 4
