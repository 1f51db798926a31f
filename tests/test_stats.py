"""analysis.stats: ratios of geometric means with paired bootstrap intervals, the decision rule,
censored time to target and the forest plot, against hand-computed values."""

from __future__ import annotations

import importlib.util
import math

import numpy as np
import pytest

from analysis import stats as T

pytest.importorskip("scipy")
HAVE_MPL = importlib.util.find_spec("matplotlib") is not None


def test_ratio_of_geometric_means_by_hand():
    r = T.ratio_ci([1, 4, 16], [1, 1, 1])  # gm 4 / gm 1
    assert r.estimate == pytest.approx(4.0)
    assert r.per_seed == (1.0, 4.0, 16.0) and r.seeds == (0, 1, 2) and r.n == 3
    assert T.ratio_ci([1, 4], [2, 2]).estimate == pytest.approx(1.0)  # gm 2 / gm 2
    # not the ratio of arithmetic means (7 / 1 here)
    assert T.ratio_ci([1, 4, 16], [1, 1, 1]).estimate != pytest.approx(7.0)


def test_constant_ratio_gives_a_degenerate_interval_at_that_ratio():
    e = np.random.default_rng(1).lognormal(0, 1, 6)
    r = T.ratio_ci(3.92 * e, e, label="priority")
    assert r.method == "degenerate"
    assert r.estimate == pytest.approx(3.92) and r.low == pytest.approx(3.92)
    assert r.high == pytest.approx(3.92) and r.low == r.estimate == r.high


def test_lognormal_data_give_an_interval_around_the_true_ratio():
    rng = np.random.default_rng(7)
    seed_effect = rng.normal(0, 1.0, 12)  # shared by both placements of a seed
    e = np.exp(seed_effect + rng.normal(0, 0.2, 12))
    p = np.exp(math.log(0.26) + seed_effect + rng.normal(0, 0.2, 12))
    r = T.ratio_ci(p, e)
    assert r.method == "BCa" and r.low < 0.26 < r.high and r.below(1)
    assert r.high / r.low < 1.6  # pairing cancels the seed effect
    # the same values with the pairing broken: the seed effect no longer cancels
    wide = T.ratio_ci(p, e[::-1])
    assert (wide.high / wide.low) > 1.5 * (r.high / r.low)


def test_coverage_is_near_95_percent():
    """Over 100 lognormal data sets of 8 seeds, the interval holds the true ratio about 95% of
    the time (bootstraps under-cover a little with few seeds)."""
    rng = np.random.default_rng(11)
    hits = 0
    for _ in range(100):
        s = rng.normal(0, 1, 8)
        e = np.exp(s + rng.normal(0, 0.3, 8))
        p = np.exp(math.log(3.92) + s + rng.normal(0, 0.3, 8))
        hits += T.ratio_ci(p, e, n_resamples=999, rng=int(rng.integers(1 << 30))).contains(3.92)
    assert 85 <= hits <= 100


def test_pairing_by_seed_and_unpaired_seeds():
    r = T.ratio_ci({0: 2.0, 1: 8.0, 2: 5.0, 3: float("nan")}, {0: 1.0, 1: 2.0, 4: 1.0, 3: 1.0})
    assert r.seeds == (0, 1) and r.unpaired == (2, 3, 4)
    assert r.estimate == pytest.approx(math.sqrt(2 * 4))
    assert T.ratio_ci({0: 2.0}, {0: 1.0}).method == "one seed"
    assert not T.ratio_ci({0: 2.0}, {0: 1.0}).has_interval
    assert T.ratio_ci({}, {}).method == "no seeds"
    with pytest.raises(ValueError, match="seed 1: num=0"):
        T.ratio_ci([1.0, 0.0], [1.0, 1.0])
    with pytest.raises(ValueError, match="one of each per seed"):
        T.ratio_ci([1.0, 2.0], [1.0])
    metrics = [{"seed": 0, "loss": 1.0}, {"seed": 1, "loss": None}]
    assert T.seed_values(metrics, "loss")[0] == 1.0 and math.isnan(
        T.seed_values(metrics, "loss")[1]
    )


def _r(low: float, high: float) -> T.Ratio:
    est = math.sqrt(low * high) if low > 0 and high > 0 else math.nan
    return T.Ratio("x", est, low, high, 0.95, (0, 1, 2), (1.0,) * 3, (1.0,) * 3, "test")


NAN = float("nan")


@pytest.mark.parametrize(
    "loss, prio, verdict, loss_status, prio_status",
    [
        # reproduced: priority above 1 and containing 3.92, loss below 1
        ((0.2, 0.3), (2.5, 5.0), T.REPRODUCED, "matches", "matches"),
        (
            (0.5, 0.9),
            (1.1, 3.92),
            T.REPRODUCED,
            "same direction, smaller than the paper",
            "matches",
        ),
        # priority right direction but excludes 3.92: not reproduced, not refuted
        (
            (0.2, 0.3),
            (1.2, 1.8),
            T.INCONCLUSIVE,
            "matches",
            "same direction, smaller than the paper",
        ),
        (
            (0.2, 0.3),
            (5.0, 9.0),
            T.INCONCLUSIVE,
            "matches",
            "same direction, larger than the paper",
        ),
        # an interval containing 1
        ((0.2, 1.1), (2.5, 5.0), T.INCONCLUSIVE, "undecided (interval contains 1)", "matches"),
        ((0.2, 0.3), (0.8, 5.0), T.INCONCLUSIVE, "matches", "undecided (interval contains 1)"),
        # refuted: an interval on the other side of 1 from the paper's value
        ((1.2, 1.5), (2.5, 5.0), T.REFUTED, "opposite direction", "matches"),
        ((0.2, 0.3), (0.4, 0.9), T.REFUTED, "matches", "opposite direction"),
        ((1.2, 1.5), (0.4, 0.9), T.REFUTED, "opposite direction", "opposite direction"),
        # no interval (one seed, no runs)
        ((NAN, NAN), (2.5, 5.0), T.INCONCLUSIVE, "no interval", "matches"),
        ((0.2, 0.3), (NAN, NAN), T.INCONCLUSIVE, "matches", "no interval"),
        # boundaries: an interval that touches 1 does not lie above or below it
        ((0.2, 1.0), (2.5, 5.0), T.INCONCLUSIVE, "undecided (interval contains 1)", "matches"),
        ((0.2, 0.3), (1.0, 5.0), T.INCONCLUSIVE, "matches", "undecided (interval contains 1)"),
    ],
)
def test_decision_rule(loss, prio, verdict, loss_status, prio_status):
    d = T.decide(_r(*loss), _r(*prio))
    assert (d.verdict, d.loss, d.priority) == (verdict, loss_status, prio_status)
    assert d.reason


def test_decision_from_data():
    rng = np.random.default_rng(3)
    s = rng.normal(0, 1, 8)
    e = np.exp(s)
    loss = T.ratio_ci(0.3 * e * np.exp(rng.normal(0, 0.3, 8)), e)
    prio = T.ratio_ci(3.92 * e * np.exp(rng.normal(0, 0.3, 8)), e)
    assert prio.contains(3.92) and loss.below(1), (prio.text(), loss.text())
    assert T.decide(loss, prio).verdict == T.REPRODUCED
    assert (
        T.decide(T.ratio_ci(e, 0.3 * e * np.exp(rng.normal(0, 0.1, 8))), prio).verdict == T.REFUTED
    )


def test_time_to_target_censors_at_the_budget():
    t = T.time_to_target([10, None, 30, float("inf"), 50], budget=100)
    assert (t.n, t.reached, t.fraction) == (5, 3, 0.6)
    assert t.times == (10, math.inf, 30, math.inf, 50)
    assert t.median == 50  # sorted 10, 30, 50, >100, >100: the 3rd time reaches half (3/5)
    assert t.fraction_low < 0.6 < t.fraction_high
    t = T.time_to_target([10, 20, 30, 40], budget=100)
    assert t.median == 20  # half of the seeds had reached it by 20
    t = T.time_to_target([10, None, float("nan"), 120], budget=100)  # 120 > budget: censored
    assert t.reached == 1 and math.isinf(t.median) and t.median_text() == "> 100"
    t = T.time_to_target([10, 20, None, None], budget=100)
    assert t.median == 20  # exactly half reached it
    assert T.time_to_target([], budget=1).median_text() == "n/a"
    with pytest.raises(ValueError, match="budget"):
        T.time_to_target([1.0], budget=0)


def test_censored_median_agrees_with_scipys_kaplan_meier():
    from scipy import stats

    rng = np.random.default_rng(5)
    for _ in range(20):
        n = int(rng.integers(3, 10))
        times = [float(x) if x < 80 else None for x in rng.uniform(5, 120, n)]
        ours = T.time_to_target(times, budget=80)
        data = stats.CensoredData(
            uncensored=[x for x in times if x is not None],
            right=[80.0] * sum(x is None for x in times),
        )
        sf = stats.ecdf(data).sf
        below = sf.quantiles[sf.probabilities <= 0.5]
        km = float(below[0]) if len(below) else math.inf
        assert ours.median == km


@pytest.mark.skipif(not HAVE_MPL, reason="matplotlib (the analysis extra) is not installed")
def test_forest_plot(tmp_path):
    rng = np.random.default_rng(2)
    e = np.exp(rng.normal(0, 1, 6))
    rows = [
        T.ratio_ci(0.3 * e * np.exp(rng.normal(0, 0.2, 6)), e, label="loss, 1.6 Mb/s"),
        T.ratio_ci(3 * e * np.exp(rng.normal(0, 0.2, 6)), e, label="priority, 1.6 Mb/s"),
        T.ratio_ci({0: 2.0}, {0: 1.0}, label="one seed"),
    ]
    out = T.forest_plot(rows, tmp_path / "forest.png", title="test")
    assert out.stat().st_size > 5000 and out.read_bytes()[:4] == b"\x89PNG"
