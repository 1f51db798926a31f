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


def test_auto_never_below_what_a_learner_group_holds_at_once():
    """K = 2 under gba: the lead trains one batch while the other learner holds up to two
    relayed ones; a window of 2 let a straggler's two orders hold every batch and the lead
    starved (2 updates in 15 s). The window keeps one more than the group holds."""
    from mpirl.agent.envs import inspect
    from mpirl.agent.gba import held_at_once
    from mpirl.roles.placements.at_buffer import site_side
    from mpirl.roles.placements.common import SiteContext
    from mpirl.run.config import Config
    from mpirl.transport.wire import Wire, transition_dtype

    assert held_at_once(1, "allreduce") == 1
    assert held_at_once(2, "allreduce") == 2 and held_at_once(2, "gba") == 3
    w = InflightWindow(floor=4)
    assert w.size == 4
    w.observe(rtt_total=0.01, hold=0.0, queue_wait=0.0, step=0.01)
    assert w.size == 4  # Little's law alone says 2
    cfg = Config(learners=2, learner_sync="gba")
    spec = inspect(cfg.env)
    wire = Wire(transition_dtype(spec.obs_shape, spec.obs_dtype), n_params=1)
    ctx = SiteContext(cfg, spec, wire, None, {"batches": None}, lambda a: None, 0)
    assert site_side(ctx).window.size == 4
