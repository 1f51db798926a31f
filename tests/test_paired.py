"""analysis.stats' paired t (t-intervals on paired log ratios, Holm, the decision rule) and
analysis.verdict (docs/results.md's generated sections equal what the committed data give)."""

import math

import numpy as np
import pytest
from scipy import stats

from analysis import stats as paired
from analysis import verdict
from analysis.stats import MATCHES, OPPOSITE, figure_outcome, holm, log_ratio_t


def test_holm_matches_the_step_down_procedure():
    # statsmodels' multipletests(p, method="holm") gives these adjusted p-values
    p = [0.01, 0.04, 0.03, 0.005, 0.2, 0.049]
    assert holm(p) == pytest.approx([0.05, 0.12, 0.12, 0.03, 0.2, 0.12])
    assert math.isnan(holm([0.3, math.nan, 0.01])[1])  # NaN stays NaN
    assert holm([0.3, math.nan, 0.01])[::2] == pytest.approx([0.3, 0.02])  # m = 2, not 3


def test_log_ratio_is_a_paired_t_interval_on_logs():
    rng = np.random.default_rng(1)
    e = {s: float(v) for s, v in enumerate(rng.lognormal(0, 0.5, 8))}
    p = {s: v * math.exp(0.3 + 0.2 * rng.standard_normal()) for s, v in e.items()}
    p[99] = 1.0  # one placement only: left out
    r = log_ratio_t(p, e)
    d = np.log([p[s] / e[s] for s in e])
    t = stats.ttest_1samp(d, 0.0)
    lo, hi = t.confidence_interval(0.95)
    assert (r.n, r.unpaired) == (8, 1)
    assert r.estimate == pytest.approx(math.exp(d.mean()))
    assert (r.low, r.high) == pytest.approx((math.exp(lo), math.exp(hi)))
    assert r.p == pytest.approx(t.pvalue)
    assert r.interval(0.99)[0] < r.low and r.interval(0.99)[1] > r.high


def test_t_interval_keeps_its_coverage_at_six_pairs():
    rng = np.random.default_rng(0)
    hits = 0
    for _ in range(2000):
        e = dict(enumerate(rng.lognormal(0, 1, 6)))
        p = {s: v * math.exp(0.5 + 0.4 * rng.standard_normal()) for s, v in e.items()}
        r = log_ratio_t(p, e)
        hits += r.low <= math.exp(0.5) <= r.high
    assert 0.93 <= hits / 2000 <= 0.97


def _ratio(shift, sd=0.1, n=20, seed=0):
    rng = np.random.default_rng(seed)
    e = {s: 1.0 for s in range(n)}
    return log_ratio_t({s: math.exp(shift + sd * rng.standard_normal()) for s in e}, e)


def test_figure_outcome_follows_the_rule():
    paper_loss, paper_prio = 0.26, 3.92
    assert figure_outcome(_ratio(math.log(0.26)), 1e-6, paper_loss, 6) == MATCHES
    assert figure_outcome(_ratio(math.log(0.8)), 1e-6, paper_loss, 6).startswith(
        "same direction, smaller"
    )
    assert figure_outcome(_ratio(math.log(10.0)), 1e-6, paper_prio, 6).startswith(
        "same direction, larger"
    )
    assert figure_outcome(_ratio(math.log(1.5)), 1e-6, paper_loss, 6) == OPPOSITE
    # Holm's p decides, not the unadjusted one
    r = _ratio(math.log(0.26))
    assert figure_outcome(r, 0.06, paper_loss, 6) == "inconclusive at n = 20"


def test_results_page_equals_what_the_committed_data_give():
    page = verdict.RESULTS.read_text()
    assert verdict.render(page) == page, "run: python -m analysis.verdict"


def test_a_page_without_the_markers_is_an_error_naming_the_fix():
    with pytest.raises(ValueError, match="BEGIN/END markers"):
        verdict.render("# no sections\n")


def test_rmst_without_censoring_is_the_mean_and_its_variance():
    x = np.random.default_rng(0).exponential(100, 40)
    mean, var = paired.rmst(x, np.ones(40, bool), tau=1e9)
    assert mean == pytest.approx(x.mean())
    assert var == pytest.approx(x.var() / 40)  # Greenwood's variance reduces to this
    # censoring at tau: the area under the KM curve up to tau, i.e. mean(min(T, tau))
    tau = 80.0
    mean, _ = paired.rmst(np.minimum(x, tau), x <= tau, tau)
    assert mean == pytest.approx(np.minimum(x, tau).mean())


# seed 0 of rng.uniform(5, 150) / (20, 80), rounded: the existing placement reaches 4 of 10 by
# tau = 90, the proposed one all 10, the curves cross; the old pair (KM normal interval and
# log-rank p) said "p 0.0074" and "[-43.7, +3.3] s" of the same difference
EXISTING = [97.0, 44.0, 11.0, 7.0, 123.0, 137.0, 93.0, 111.0, 84.0, 141.0]
PROPOSED = [69.0, 20.0, 71.0, 22.0, 64.0, 31.0, 72.0, 52.0, 38.0, 45.0]


def _sides(e, p, tau):
    return (
        {i: (t, t <= tau) for i, t in enumerate(p)},
        {i: (t, t <= tau) for i, t in enumerate(e)},
    )


def test_time_to_target_decision_agrees_with_its_interval_where_the_old_pair_did_not():
    from lifelines.statistics import logrank_test

    tau = 90.0
    e, p = np.array(EXISTING), np.array(PROPOSED)
    he, hp = e <= tau, p <= tau
    de, dp = np.where(he, e, tau), np.where(hp, p, tau)
    # the old pair: log-rank p below 0.05 while the RMST difference's normal interval held 0
    (me, ve), (mp, vp) = paired.rmst(de, he, tau), paired.rmst(dp, hp, tau)
    half = 1.96 * math.sqrt(ve + vp)
    assert logrank_test(dp, de, hp, he).p_value < 0.05
    assert mp - me - half < 0 < mp - me + half
    # the new one: one paired t procedure on the restricted differences
    td = paired.rmst_paired(*_sides(e, p, tau), tau)
    assert td.estimate == pytest.approx(mp - me)  # all censoring at tau: KM's RMST is the mean
    assert (td.rmst_learner, td.rmst_buffer) == pytest.approx((me, mp))
    assert (td.reached_learner, td.reached_buffer, td.n) == (4, 10, 10)
    d = dp - de
    t = stats.ttest_1samp(d, 0.0)
    assert td.p == pytest.approx(t.pvalue)
    ci = t.confidence_interval(0.95)
    assert (td.low, td.high) == pytest.approx((ci.low, ci.high))
    assert (td.p < 0.05) == (not td.low <= 0 <= td.high)


@pytest.mark.parametrize("seed", range(40))
def test_time_to_target_p_below_alpha_exactly_when_the_interval_excludes_0(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 21))
    e = np.round(rng.uniform(5, 150, n))
    p = np.round(e * rng.lognormal(rng.normal(0, 0.5), 0.4, n))
    td = paired.rmst_paired(*_sides(e, p, 90.0), 90.0)
    for level in (0.95, 0.99):
        lo, hi = td.interval(level)
        assert (td.p < 1 - level) == (not lo <= 0 <= hi)


def test_time_to_target_of_identical_differences_and_of_one_pair():
    same = paired.rmst_paired({0: (10.0, True), 1: (20.0, True)}, {0: (5, True), 1: (15, True)}, 90)
    assert (same.estimate, same.low, same.high, same.p) == (5.0, 5.0, 5.0, 0.0)
    one = paired.rmst_paired({0: (10.0, True), 7: (1.0, True)}, {0: (5.0, True)}, 90)
    assert one.n == 1 and one.unpaired == 1 and math.isnan(one.p) and "no interval" in one.text()
