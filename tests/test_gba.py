"""The GBA aggregator (mpirl.agent.gba): exactly the global batch, the staleness rule,
never twice."""

import numpy as np
import pytest

from mpirl.agent.gba import Contribution, GlobalBatch, decay


def _c(i, learner=0, version=0, n=4, value=None):
    g = np.full(3, float(i if value is None else value), np.float32)
    return Contribution(i, learner, version, n, g)


def test_assembles_exactly_the_global_batch():
    agg = GlobalBatch(samples=8, max_staleness=4)
    agg.add(_c(0, n=4))
    assert not agg.ready(0) and agg.take(0) is None
    agg.add(_c(1, n=4))
    t = agg.take(0)
    assert sum(c.n for c in t.used) == 8 and [c.id for c in t.used] == [0, 1]
    # fresh gradients: the sample-weighted mean, as one batch of 8 would give
    np.testing.assert_allclose(t.grad, np.full(3, 0.5), rtol=1e-6)
    assert agg.waiting == type(agg.waiting)()


def test_unequal_sizes_fill_exactly_and_an_overfill_waits():
    agg = GlobalBatch(samples=8, max_staleness=None)
    for i, n in enumerate([6, 4, 2]):  # 6 + 4 > 8: the 4 waits, the 2 completes the batch
        agg.add(_c(i, n=n, value=1.0))
    t = agg.take(0)
    assert [c.id for c in t.used] == [0, 2] and sum(c.n for c in t.used) == 8
    assert [c.id for c in agg.waiting] == [1]
    np.testing.assert_allclose(t.grad, np.ones(3))


def test_decays_inside_the_bound_and_drops_beyond():
    assert decay(0, 3) == 1.0 and decay(1, 3) == 0.5 and decay(3, 3) == 0.25
    assert decay(4, 3) == 0.0 and decay(100, None) == pytest.approx(1 / 101)
    agg = GlobalBatch(samples=8, max_staleness=2)
    agg.add(_c(0, version=7, n=4, value=1.0))  # staleness 3 at version 10: dropped
    agg.add(_c(1, version=9, n=4, value=1.0))  # staleness 1: half weight
    agg.add(_c(2, version=10, n=4, value=1.0))  # fresh
    t = agg.take(10)
    assert [c.id for c, _ in t.dropped] == [0] and [s for _, s in t.dropped] == [3]
    assert t.staleness == [1, 0] and t.scales == [0.5, 1.0]
    np.testing.assert_allclose(t.grad, np.full(3, (0.5 * 4 + 4) / 8))
    assert agg.dropped == 1 and agg.applied == 2


def test_dropped_samples_do_not_count_toward_the_batch():
    agg = GlobalBatch(samples=8, max_staleness=1)
    agg.add(_c(0, version=0, n=4))
    agg.add(_c(1, version=5, n=4))
    assert not agg.ready(5)  # the first is 5 stale: dropped, 4 of 8 samples left
    agg.add(_c(2, version=5, n=4))
    t = agg.take(5)
    assert [c.id for c in t.used] == [1, 2] and [c.id for c, _ in t.dropped] == [0]


def test_never_applies_a_gradient_twice():
    agg = GlobalBatch(samples=4, max_staleness=None)
    agg.add(_c(0, n=4))
    with pytest.raises(ValueError, match="applied at most once"):
        agg.add(_c(0, n=4))
    t = agg.take(0)
    assert [c.id for c in t.used] == [0]
    with pytest.raises(ValueError, match="at most once"):
        agg.add(_c(0, n=4))  # not even after it was applied
    assert agg.take(0) is None
    rng = np.random.default_rng(0)
    ids = []
    agg = GlobalBatch(samples=8, max_staleness=2)
    v = 0
    for i in range(200):  # random arrivals: each id comes out once, used or dropped
        agg.add(_c(i, version=v - int(rng.integers(0, 4)), n=int(rng.choice([2, 4]))))
        t = agg.take(v)
        if t is not None:
            ids += [c.id for c in t.used] + [c.id for c, _ in t.dropped]
            assert sum(c.n for c in t.used) == 8
            v += 1
    assert len(ids) == len(set(ids))


def test_async_is_every_gradient_at_full_weight():
    agg = GlobalBatch(samples=4, max_staleness=None, decay=False)
    agg.add(_c(0, version=0, n=4, value=2.0))
    t = agg.take(9)
    assert t.scales == [1.0] and t.staleness == [9]
    np.testing.assert_allclose(t.grad, np.full(3, 2.0))


def test_bad_values_are_refused():
    with pytest.raises(ValueError, match="samples=0"):
        GlobalBatch(0, None)
    agg = GlobalBatch(4, None)
    with pytest.raises(ValueError, match="n=5"):
        agg.add(_c(0, n=5))
    with pytest.raises(ValueError, match="staleness=-1"):
        decay(-1, None)


def test_the_aggregator_keeps_no_record_that_grows_with_the_run():
    """Knowing that no gradient is applied twice costs O(1): a set of every id seen grew by
    ~74 B per gradient (240 MB an hour at the bench's rate)."""
    agg = GlobalBatch(samples=4, max_staleness=2)
    for i in range(20_000):
        agg.add(_c(i, version=i, n=4))
        assert agg.take(i) is not None
    sizes = {k: len(v) for k, v in vars(agg).items() if hasattr(v, "__len__")}
    assert all(n < 10 for n in sizes.values()), sizes


def test_the_switch_rule_follows_a_straggler_and_does_not_flap():
    """Synchronous while the learners keep pace (noise of +-20%, and a 0.3 s hiccup of the lead
    included), GBA once one is 4x slower for good, back once it keeps pace again; never a
    switch within hold_s of the last."""
    from mpirl.agent.gba import SwitchRule

    rng = np.random.default_rng(0)
    rule = SwitchRule(k=3, now=0.0)
    sync, switches, t = True, [], 0.0
    for phase, slow, until in ((0, 1.0, 6.0), (1, 4.0, 12.0), (2, 1.0, 18.0)):
        while t < until:
            t += 0.01
            for j in range(3):
                f = slow if j == 1 else 3.0 if j == 0 and 3.0 < t < 3.3 else 1.0
                if j != 1 or slow == 1.0 or rng.random() < 0.25:  # a straggler sends fewer
                    rule.observe(j, 0.01 * f * rng.uniform(0.8, 1.2), t)
            if rule.decide(sync, t) is not None:
                sync = not sync
                switches.append((phase, sync, round(t, 1)))
    assert [(p, s) for p, s, _ in switches] == [(1, False), (2, True)], switches
    # within the horizon (2 s) and the persistence (1 s) of the change, with a margin
    assert 6.0 < switches[0][2] < 9.5 and 12.0 < switches[1][2] < 15.5, switches
    with pytest.raises(ValueError):
        SwitchRule(k=2, up=1.2, down=1.5)
