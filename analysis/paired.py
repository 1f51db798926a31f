"""Paired t statistics on log ratios, Holm's correction and the decision rule of the
equal-wall-time plan (docs/results.md, "Plan for the equal-wall-time experiment").

Paired log ratio (`log_ratio_t`)
--------------------------------
For a positive metric measured in both placements (``replay_at``) of seeds i = 1..n,

    d_i = log(buffer_i / learner_i),   estimate = exp(mean d)   (ratio of geometric means),
    interval = exp(mean d +- t(1 - a/2, n - 1) * sd(d) / sqrt(n)),
    p = two-sided one-sample t-test of mean d = 0   (scipy.stats.ttest_1samp).

The t-interval keeps its coverage at small n where a bootstrap interval over a handful of pairs
does not. A seed measured in one placement only is left out (and counted in ``unpaired``).

Holm (`holm`)
-------------
Holm's step-down procedure: sort the m p-values, compare the k-th smallest (k = 0..m-1) with
alpha / (m - k), stop at the first that fails; the adjusted p-value is the running maximum of
(m - k) p_(k), capped at 1. It controls the family-wise error rate at alpha with no assumption
about the dependence between the tests. Written out here (ten lines) rather than adding
statsmodels, whose ``multipletests(method="holm")`` gives the same numbers (see
tests/test_paired.py).

Decision (`figure_outcome`)
---------------------------
For one (cell, figure) with the paper's value v: Holm-adjusted p < alpha in the paper's
direction (ratio below 1 if v < 1, above 1 if v > 1) -> "matches the paper" when the
simultaneous interval (level 1 - alpha/m) contains v, else "same direction, smaller / larger
than the paper"; Holm-adjusted p < alpha in the other direction -> "opposite direction";
otherwise "inconclusive at n = N".
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["LogRatio", "figure_outcome", "holm", "km_compare", "log_ratio_t", "rmst"]

MATCHES = "matches the paper"
OPPOSITE = "opposite direction"


@dataclass(frozen=True)
class LogRatio:
    """num / den (replay_at=buffer / replay_at=learner) of one metric in one cell (see the
    module docstring)."""

    estimate: float
    low: float  # 95% t-interval (NaN with fewer than 2 pairs)
    high: float
    p: float  # two-sided paired t-test of log ratio = 0
    n: int
    sd: float  # SD of the per-seed log ratios
    unpaired: int = 0

    def interval(self, confidence: float) -> tuple[float, float]:
        """The t-interval at another level (e.g. the simultaneous 1 - alpha/m)."""
        from scipy import stats

        if self.n < 2 or not math.isfinite(self.sd):
            return math.nan, math.nan
        half = stats.t.ppf(0.5 + confidence / 2, self.n - 1) * self.sd / math.sqrt(self.n)
        m = math.log(self.estimate)
        return math.exp(m - half), math.exp(m + half)

    def text(self, digits: int = 3) -> str:
        if not math.isfinite(self.low):
            return f"{self.estimate:.{digits}g} (no interval, n = {self.n})"
        return f"{self.estimate:.{digits}g} [{self.low:.{digits}g}, {self.high:.{digits}g}]"


def _pairs(num: Mapping, den: Mapping) -> tuple[np.ndarray, int]:
    seeds = sorted(set(num) | set(den), key=str)
    d, unpaired = [], 0
    for s in seeds:
        p, e = num.get(s, math.nan), den.get(s, math.nan)
        if all(isinstance(v, (int, float)) and math.isfinite(v) and v > 0 for v in (p, e)):
            d.append(math.log(p / e))
        else:
            unpaired += 1
    return np.asarray(d, dtype=float), unpaired


def log_ratio_t(num: Mapping, den: Mapping, confidence: float = 0.95) -> LogRatio:
    """``{seed: value}`` of each side (replay_at=buffer, replay_at=learner) -> `LogRatio`
    (module docstring)."""
    from scipy import stats

    d, unpaired = _pairs(num, den)
    n = len(d)
    if n == 0:
        return LogRatio(math.nan, math.nan, math.nan, math.nan, 0, math.nan, unpaired)
    est = math.exp(float(d.mean()))
    if n < 2:
        return LogRatio(est, math.nan, math.nan, math.nan, n, math.nan, unpaired)
    sd = float(d.std(ddof=1))
    if sd == 0.0:  # every seed the same ratio: a point, and p is 0 unless that ratio is 1
        p = 1.0 if d[0] == 0 else 0.0
        return LogRatio(est, est, est, p, n, 0.0, unpaired)
    p = float(stats.ttest_1samp(d, 0.0).pvalue)
    r = LogRatio(est, math.nan, math.nan, p, n, sd, unpaired)
    lo, hi = r.interval(confidence)
    return LogRatio(est, lo, hi, p, n, sd, unpaired)


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm-adjusted p-values, in the input order (NaN stays NaN and is not counted in m)."""
    idx = [i for i, p in enumerate(pvalues) if math.isfinite(p)]
    m = len(idx)
    out = [math.nan] * len(pvalues)
    running = 0.0
    for k, i in enumerate(sorted(idx, key=lambda i: pvalues[i])):
        running = max(running, min(1.0, (m - k) * pvalues[i]))
        out[i] = running
    return out


def figure_outcome(r: LogRatio, p_holm: float, paper: float, m: int, alpha: float = 0.05) -> str:
    """The decision for one (cell, figure) (module docstring)."""
    if not (math.isfinite(p_holm) and p_holm < alpha):
        return f"inconclusive at n = {r.n}"
    if (r.estimate < 1) != (paper < 1):
        return OPPOSITE
    lo, hi = r.interval(1 - alpha / m)
    if lo <= paper <= hi:
        return MATCHES
    smaller = abs(math.log(math.sqrt(lo * hi))) < abs(math.log(paper))
    return f"same direction, {'smaller' if smaller else 'larger'} than the paper"


# --- time to target as survival ---------------------------------------------------------------


def rmst(durations: np.ndarray, events: np.ndarray, tau: float) -> tuple[float, float]:
    """Kaplan-Meier restricted mean survival time up to ``tau`` and the variance of that
    estimate: sum over event times t_j <= tau of A_j^2 d_j / (Y_j (Y_j - d_j)), with A_j the area
    under the KM curve from t_j to tau (terms with Y_j = d_j count 0, as R's survRM2 does).
    The KM fit is lifelines'; lifelines' own ``return_variance`` is the variance of
    min(T, tau) itself, not of the estimate."""
    from lifelines import KaplanMeierFitter

    km = KaplanMeierFitter().fit(durations, events)
    tab = km.event_table
    t = np.asarray(tab.index, dtype=float)
    surv = km.survival_function_at_times(t).to_numpy()
    keep = t <= tau
    t, surv = t[keep], surv[keep]
    edges = np.append(t, tau)
    pieces = surv * np.diff(edges)  # S is constant on [t_k, t_k+1)
    area_after = np.cumsum(pieces[::-1])[::-1]  # A at each t_k: from t_k to tau
    d = tab["observed"].to_numpy()[keep]
    y = tab["at_risk"].to_numpy()[keep]
    with np.errstate(divide="ignore", invalid="ignore"):
        w = np.where(y > d, d / (y * (y - d)), 0.0)
    return float(pieces.sum()), float(np.sum(area_after**2 * w))


def km_compare(
    times: dict[str, np.ndarray], reached: dict[str, np.ndarray], tau: float
) -> dict[str, float]:
    """Time to target as survival, censored at ``tau``, for each placement (``times`` and
    ``reached`` keyed by replay_at, "learner" and "buffer"): each placement's restricted mean
    time to target (`rmst`), the difference buffer - learner
    with a 95% normal interval, and the log-rank p (lifelines)."""
    from lifelines.statistics import logrank_test

    out: dict[str, float] = {"tau": tau}
    data = {}
    for k in ("learner", "buffer"):
        event = np.asarray(reached[k], bool) & (np.asarray(times[k]) <= tau)
        dur = np.where(event, times[k], tau)
        data[k] = (dur, event)
        out[f"rmst_{k}"], out[f"var_{k}"] = rmst(dur, event, tau)
        out[f"reached_{k}"], out[f"n_{k}"] = int(event.sum()), len(dur)
    diff = out["rmst_buffer"] - out["rmst_learner"]
    half = 1.96 * math.sqrt(out["var_buffer"] + out["var_learner"])
    out.update(diff=diff, diff_low=diff - half, diff_high=diff + half)
    (dp, ep), (de, ee) = data["buffer"], data["learner"]
    out["logrank_p"] = float(logrank_test(dp, de, ep, ee).p_value)
    return out
