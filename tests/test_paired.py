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
