"""The GBA aggregator (mpirl.agent.gba): exactly the global batch, the staleness rule,
never twice."""

import numpy as np
import pytest

from mpirl.agent.gba import Contribution, GlobalBatch, Tokens, decay


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


# ---- token control (GBA's, docs/design.md "Learner group") ---------------------------------------


def test_only_severe_staleness_is_decayed():
    """Up to ``severe`` steps stale: full weight; beyond: 1/(1+s-severe); beyond the bound:
    dropped.  severe=0 is 1/(1+s) for every stale gradient."""
    assert [decay(s, 4, severe=2) for s in range(6)] == [1.0, 1.0, 1.0, 0.5, 1 / 3, 0.0]
    assert [decay(s, None, severe=0) for s in range(4)] == [1.0, 0.5, 1 / 3, 0.25]
    with pytest.raises(ValueError):
        decay(0, 4, severe=-1)
    agg = GlobalBatch(samples=8, max_staleness=4, severe=2)
    agg.add(Contribution(0, 1, 0, 4, np.ones(3, np.float32), token=7))  # 3 steps stale: 1/2
    agg.add(Contribution(1, 0, 8, 4, np.ones(3, np.float32), token=9))  # 1 step: full
    t = agg.take(10)
    assert t.staleness == [3, 1] and t.scales == [0.5, 1.0]


def test_staleness_is_read_from_the_token_and_an_early_token_waits():
    """A gradient's staleness is steps since its token (not since the weights it was computed
    on); one whose token is after the step waits for the next update unless ``ahead``."""
    agg = GlobalBatch(samples=8, max_staleness=1)
    g = np.ones(3, np.float32)
    agg.add(Contribution(0, 1, 2, 4, g, token=5))  # weights 3 updates old, token current
    agg.add(Contribution(1, 0, 5, 4, g, token=6))  # meant for the next step
    agg.add(Contribution(2, 0, 5, 4, g, token=5))
    assert not agg.ready(5, ahead=False) or agg.take(5, ahead=False).staleness == [0, 0]
    assert [c.id for c in agg.waiting] == [1]
    agg.add(Contribution(3, 1, 5, 4, g, token=7))
    assert agg.take(5, ahead=False) is None  # both are early
    t = agg.take(5, ahead=True)  # the supply is spent: they fill this step, 0 stale
    assert [c.id for c in t.used] == [1, 3] and t.staleness == [0, 0] and not t.dropped


def test_tokens_k_per_step_on_demand_at_most_two_steps_ahead():
    """The next token is for step ``step + pending // K`` (pending: tokens out and gradients
    in, not applied); a learner takes one below its depth while it is at most 2 ahead."""
    tk = Tokens(3, [1, 2, 2])
    assert [tk.claim(j, 0, 0) for j in (1, 2, 0)] == [0, 0, 0]  # K tokens of step 0
    assert tk.claim(0, 0, 0) is None  # the lead holds its one (depth 1)
    assert tk.claim(1, 0, 0) == 1  # pipelined: the next token, step 1's
    assert tk.claim(1, 0, 0) is None and not tk.blocked(0, 0)  # at its depth; 2 is not
    assert tk.claim(2, 0, 0) == 1
    # everyone busy at its depth: nobody waits for a token, so the step waits for its own
    # gradients (blocked here filled it with later ones: 19% stale at equal speed, measured)
    assert not tk.blocked(0, 0)
    tk.returned(0)  # the lead's gradient is in (1 waiting): it goes on, step 1's last token
    assert tk.claim(0, 0, 1) == 1
    tk.returned(0)
    assert tk.claim(0, 0, 2) == 2  # while the others compute, up to 2 steps ahead
    tk.returned(0)
    assert tk.claim(0, 0, 3) == 2
    tk.returned(0)
    assert tk.claim(0, 0, 4) == 2
    tk.returned(0)
    assert not tk.can_claim(0, 0, 5) and tk.blocked(0, 5)  # the next is step 3: 3 ahead,
    assert not Tokens(2, [1, 1]).blocked(0, 4)  # both idle, the next token (step 2) is theirs
    assert Tokens(2, [1, 1]).blocked(0, 6)  # the next is step 3: both wait for an update
    assert tk.claim(0, 1, 5 - 3) == 3  # an update took 3: step 1, pending 4 + 2: step 3
    tk.returned(0)
    assert tk.claim(0, 1, 0) == 2  # two dropped as too stale: their places are free
    with pytest.raises(ValueError, match="does not hold"):
        tk.returned(0) or tk.returned(0)
    tk.reset()
    assert tk.held == [0, 0, 0] and tk.claim(2, 5, 0) == 5
    with pytest.raises(ValueError):
        Tokens(2, [1])


def _simulate(times, seconds=60.0, jitter=0.05, seed=0):
    """An event simulation of the lead's token control (the lead depth 1, the others
    `mpirl.agent.gba.PIPELINE`), learner j taking ``times[j]`` (+- jitter) per gradient; the
    server reacts at once (its own thread: docs/design.md).  Returns per-learner gradients
    applied and the staleness of every applied gradient."""
    from mpirl.agent.gba import PIPELINE

    rng = np.random.default_rng(seed)
    k = len(times)
    tokens = Tokens(k, [1] + [PIPELINE] * (k - 1))
    agg = GlobalBatch(samples=k * 4, max_staleness=4, severe=2)
    queue = [[] for _ in range(k)]  # tokens held, in order
    busy = [None] * k  # (finish time, token, version) of the gradient being computed
    step, t, nid = 0, 0.0, 0
    applied, stale = [0] * k, []
    while t < seconds:
        for depth in (1, 2):  # the server hands out: a first token to each, then a second
            for j in range(k):
                if len(queue[j]) + (busy[j] is not None) < depth:
                    u = tokens.claim(j, step, len(agg.waiting))
                    if u is not None:
                        queue[j].append(u)
        for j in range(k):
            if busy[j] is None and queue[j]:
                dt = times[j] * (1 + jitter * rng.uniform(-1, 1))
                busy[j] = (t + dt, queue[j].pop(0), step)
        j = min((j for j in range(k) if busy[j] is not None), key=lambda j: busy[j][0])
        t, token, version = busy[j]
        busy[j] = None
        tokens.returned(j)
        agg.add(Contribution(nid, j, version, 4, np.ones(2, np.float32), token=token))
        nid += 1
        while (taken := agg.take(step, tokens.blocked(step, len(agg.waiting)))) is not None:
            step += 1
            for c, s in zip(taken.used, taken.staleness, strict=True):
                applied[c.learner] += 1
                stale.append(s)
    return applied, stale, step


def test_at_equal_speed_gba_is_synchronous():
    """K learners at equal speed: every learner takes one token per step and every gradient
    is applied at the step of its token (staleness 0), each learner an equal share."""
    for k in (2, 3, 4):
        applied, stale, steps = _simulate([1.0] * k)
        assert np.mean(np.array(stale) == 0) >= 0.99, (k, np.bincount(stale))
        assert max(applied) - min(applied) <= 2 * k, applied
        assert steps >= 55  # about one step per second: no learner waits on another's token


def test_a_fast_learner_contributes_more_than_a_slow_one():
    """A straggler (3x slower) does not set the pace: the others take the tokens it has not
    claimed and compute about 3x as many gradients; the updates go at the fast learners'
    rate, not the straggler's; its gradients come in stale but inside the bound."""
    applied, stale, steps = _simulate([1.0, 1.0, 3.0])
    assert applied[0] > 2.5 * applied[2] and applied[1] > 2.5 * applied[2], applied
    # synchronous training: one step per 3 s (the straggler's), 20 in 60 s; the fast pace:
    # (1 + 1 + 1/3) gradients a second over K = 3 per step, 46 in 60 s
    assert steps > 2 * 20, steps
    assert max(stale) <= 4


def test_the_switch_rule_ignores_a_learner_steadily_slower_by_its_own_nature():
    """The lead, which also relays and serves, computed 1.5-2.3x the other learner's time per
    batch at load 4 with no straggler: the rule took it for a straggler and flapped the group
    into GBA and back every few seconds. Against its own baseline it keeps pace; a learner
    that then becomes 4x slower than it was still switches the group, and back."""
    from mpirl.agent.gba import SwitchRule

    rng = np.random.default_rng(1)
    rule = SwitchRule(k=2, now=0.0)
    sync, switches, t = True, [], 0.0
    for phase, slow, until in ((0, 1.0, 10.0), (1, 4.0, 16.0), (2, 1.0, 24.0)):
        while t < until:
            t += 0.01
            rule.observe(0, 0.01 * 1.8 * slow * rng.uniform(0.8, 1.2), t)  # the lead, 1.8x
            rule.observe(1, 0.01 * rng.uniform(0.8, 1.2), t)
            if rule.decide(sync, t) is not None:
                sync = not sync
                switches.append((phase, sync))
    assert switches == [(1, False), (2, True)], switches


def test_the_switch_rule_takes_a_learner_slow_from_the_start_for_a_straggler():
    """A learner 4x slower from the first batch has no faster past to be measured against: its
    baseline is capped at twice the fastest learner's, so the group still goes GBA (and stays
    there while it is slow); 1.3x from the start is its own pace."""
    from mpirl.agent.gba import SwitchRule

    for factor, expected in ((4.0, [False]), (1.3, [])):
        rng = np.random.default_rng(2)
        rule = SwitchRule(k=2, now=0.0)
        sync, switches, t = True, [], 0.0
        while t < 10.0:
            t += 0.01
            rule.observe(0, 0.01 * rng.uniform(0.8, 1.2), t)
            if rng.random() < 1 / factor:  # the slow learner sends fewer
                rule.observe(1, 0.01 * factor * rng.uniform(0.8, 1.2), t)
            if rule.decide(sync, t) is not None:
                sync = not sync
                switches.append(sync)
        assert switches == expected, (factor, switches)


def test_the_switch_rule_looks_at_its_figures_at_most_every_50_ms():
    """The lead asks the rule every turn; the medians cost ~160 us, so at ~400 turns a second
    'switch' made 27% fewer updates than 'allreduce' with no straggler. It looks at most every
    CHECK_S."""
    from mpirl.agent.gba import SwitchRule

    rule = SwitchRule(k=2, now=0.0)
    looked = []
    real = rule.figures
    rule.figures = lambda now: looked.append(now) or real(now)
    t = 0.0
    while t < 1.0:
        t += 0.001
        rule.observe(0, 0.001, t)
        rule.observe(1, 0.001, t)
        rule.decide(True, t)
    assert 18 <= len(looked) <= 21, len(looked)
