"""The statistics of every report: paired seeds, ratios of geometric means with their intervals,
Holm's correction, the decision rules, and time to target.

Every comparison is replay_at=buffer (the paper's proposed placement, ``num``) against
replay_at=learner (the existing one, ``den``) over seeds run in both placements: the same seed
gives the same environment seeds and the same initial network, so seed i of one placement is
paired with seed i of the other (`pair_by_seed`). A seed measured in one placement only is left
out of the comparison and counted as unpaired. The ratio is one of geometric means,

    R = exp(mean_i log num_i - mean_i log den_i),

so a ratio and its inverse are symmetric and one outlying seed cannot dominate as it does a
ratio of arithmetic means.

The equal-wall-time plan (docs/results.md, "Plan for the equal-wall-time experiment")
------------------------------------------------------------------------------------
*Paired log ratio* (`log_ratio_t`, `ratio` for a cell of per-run rows): with
d_i = log(buffer_i / learner_i),

    estimate = exp(mean d),
    interval = exp(mean d +- t(1 - a/2, n - 1) * sd(d) / sqrt(n)),
    p = two-sided one-sample t-test of mean d = 0   (scipy.stats.ttest_1samp).

The t-interval keeps its coverage at small n where a bootstrap interval over a handful of pairs
does not.

*Holm* (`holm`): sort the m p-values, compare the k-th smallest (k = 0..m-1) with
alpha / (m - k), stop at the first that fails; the adjusted p-value is the running maximum of
(m - k) p_(k), capped at 1. It controls the family-wise error rate at alpha with no assumption
about the dependence between the tests. Written out here (ten lines) rather than adding
statsmodels, whose ``multipletests(method="holm")`` gives the same numbers (see
tests/test_paired.py).

*Decision* (`figure_outcome`): for one (cell, figure) with the paper's value v: Holm-adjusted
p < alpha in the paper's direction (ratio below 1 if v < 1, above 1 if v > 1) -> "matches the
paper" when the simultaneous interval (level 1 - alpha/m) contains v, else "same direction,
smaller / larger than the paper"; Holm-adjusted p < alpha in the other direction -> "opposite
direction"; otherwise "inconclusive at n = N".

*Time to target* (`rmst_paired`, `rmst_cell`): every run is censored at tau (the shortest
run of the cell), so a run's restricted time is min(time to target, tau), tau when it did not
reach the target by then. With every censoring at tau, the Kaplan-Meier restricted mean time
(RMST, `rmst`) of a placement is the plain mean of its restricted times, and the difference
proposed - existing is the mean of the per-seed differences d_i over the seeds run in both
placements. Its test and its interval are one paired t procedure on d, as for the ratios:
p = two-sided one-sample t-test of mean d = 0, interval = mean d +- t(1 - a/2, n - 1) sd(d) /
sqrt(n); p < a exactly when the interval excludes 0, so the decision and the interval shown
cannot disagree (the KM normal interval and the log-rank p used before could: the log-rank test
compares whole curves, not the restricted means the interval is on). Every seed having the same
difference gives a point: p 1 when that difference is 0, else 0 (as `log_ratio_t`).

The fixed-update appendix (docs/results/appendix/fixed-updates.md, its Plan)
---------------------------------------------------------------------------
*Bootstrap ratio* (`ratio_ci`): the 95% confidence interval of R is ``scipy.stats.bootstrap``
over the seeds with ``paired=True``: each resample draws seeds with replacement and keeps both
placements' values of a drawn seed together, so what the seeds share (an easy or hard seed)
cancels in the ratio. The interval method is BCa (scipy's default); when BCa cannot give one
(scipy's degenerate-data warning) the percentile interval is used and `Ratio.method` says so.
Every per-seed value is kept. When every seed has the same ratio the interval is that ratio
(``method = "degenerate"``); one seed gives no interval (NaN). The unpaired seeds are listed in
`Ratio.unpaired`.

*Decision rule* (`decide`): with the paper's figures L = 0.26 (training loss, proposed /
existing) and P = 3.92 (average priority of the transferred experiences, proposed / existing),
and the 95% intervals [lo, hi] of the measured loss ratio and priority ratio in one cell:

* **reproduced**: the priority interval lies above 1 (lo > 1) and contains P (lo <= P <= hi),
  and the loss interval lies below 1 (hi < 1);
* **refuted in this regime**: some interval lies entirely on the other side of 1 from the
  paper's value (priority: hi < 1; loss: lo > 1), so it excludes the paper's value and its
  direction;
* **inconclusive**: anything else (an interval that contains 1, a priority ratio above 1 but
  not containing 3.92, a missing interval).

The two outcomes exclude each other. Each figure also gets a status of its own
(`figure_status`): "matches", "same direction, smaller/larger than the paper", "opposite
direction" or "undecided (interval contains 1)". A cell decides when the existing placement
delivered less than `DECIDING` of production (the paper's regime).

*Time to target* (`time_to_target`): a seed that did not reach the target within the budget (or
failed, or has no value) counts as reached after the budget ("> budget"): it is censored, never
dropped. Reported: the fraction of seeds that reached the target (with its 95% Wilson interval,
``scipy.stats.binomtest``) and the median, defined as the first time by which at least half of
the seeds had reached it (the Kaplan-Meier median; with every censoring at the budget it is the
ceil(n/2)-th smallest time); ``inf`` when fewer than half reached it, written "> budget".

*Forest plot* (`forest_plot`): one row per bootstrap ratio, with its per-seed ratios.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "DECIDING",
    "MATCHES",
    "OPPOSITE",
    "PAPER_LOSS",
    "PAPER_PRIORITY",
    "Decision",
    "LogRatio",
    "Ratio",
    "TimeDiff",
    "TimeToTarget",
    "decide",
    "figure_outcome",
    "figure_status",
    "forest_plot",
    "holm",
    "log_ratio_t",
    "pair_by_seed",
    "ratio",
    "ratio_ci",
    "rmst",
    "rmst_cell",
    "rmst_paired",
    "seed_values",
    "time_to_target",
]

#: the paper's figures, proposed / existing: training loss and transferred priority
PAPER_LOSS = 0.26
PAPER_PRIORITY = 3.92
#: the fixed-update design's regime: a cell decides when replay_at=learner delivers less than
#: this fraction of production
DECIDING = 0.9
REPRODUCED, REFUTED, INCONCLUSIVE = "reproduced", "refuted in this regime", "inconclusive"
MATCHES = "matches the paper"
OPPOSITE = "opposite direction"


# --- pairing seeds --------------------------------------------------------------------------------


def _value(v: Any) -> float:
    """A number, or NaN for None, blanks and text."""
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


def pair_by_seed(
    num: Mapping | Sequence,
    den: Mapping | Sequence,
    seeds: Sequence | None = None,
    *,
    nonpositive: str = "raise",
) -> tuple[list, list[float], list[float], list]:
    """The seeds measured in both placements, paired: ``(seeds, num values, den values,
    unpaired seeds)``.

    ``num`` and ``den``: ``{seed: value}`` mappings (paired by seed, in seed order), or two
    sequences of equal length paired by position (``seeds`` names them, default 0..n-1). A seed
    with a value (not None, not NaN) on one side only is unpaired. A ratio of geometric means
    needs positive values: ``nonpositive="raise"`` makes a value <= 0 an error, ``"drop"``
    counts its seed as unpaired."""
    if isinstance(num, Mapping) != isinstance(den, Mapping):
        raise TypeError("pass both sides as {seed: value} mappings or both as sequences")
    if isinstance(num, Mapping):
        if seeds is not None:
            raise TypeError("seeds= goes with sequences; mappings carry their seeds")
        keys = sorted(set(num) | set(den), key=lambda s: (str(type(s)), s))
        p = [num.get(k) for k in keys]
        e = [den.get(k) for k in keys]
    else:
        p, e = list(num), list(den)
        if len(p) != len(e):
            raise ValueError(
                f"{len(p)} numerator values and {len(e)} denominator ones: paired "
                "values need one of each per seed (use {seed: value} mappings "
                "when seeds are missing)"
            )
        keys = list(seeds) if seeds is not None else list(range(len(p)))
        if len(keys) != len(p):
            raise ValueError(f"{len(keys)} seeds for {len(p)} values")
    used, pv, ev, unpaired = [], [], [], []
    for k, a, b in zip(keys, map(_value, p), map(_value, e), strict=True):
        if math.isfinite(a) and math.isfinite(b):
            if a <= 0 or b <= 0:
                if nonpositive == "drop":
                    unpaired.append(k)
                    continue
                raise ValueError(
                    f"seed {k}: num={a:g}, den={b:g}; a ratio of geometric means needs positive "
                    "values"
                )
            used.append(k)
            pv.append(a)
            ev.append(b)
        elif math.isfinite(a) or math.isfinite(b):
            unpaired.append(k)
    return used, pv, ev, unpaired


# --- paired t on log ratios (the equal-wall-time plan) --------------------------------------------


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


def log_ratio_t(num: Mapping, den: Mapping, confidence: float = 0.95) -> LogRatio:
    """``{seed: value}`` of each side (replay_at=buffer, replay_at=learner) -> `LogRatio`
    (module docstring); a seed with a value <= 0 counts as unpaired."""
    from scipy import stats

    _, p, e, unpaired = pair_by_seed(num, den, nonpositive="drop")
    d = np.asarray([math.log(a / b) for a, b in zip(p, e, strict=True)], dtype=float)
    n, k = len(d), len(unpaired)
    if n == 0:
        return LogRatio(math.nan, math.nan, math.nan, math.nan, 0, math.nan, k)
    est = math.exp(float(d.mean()))
    if n < 2:
        return LogRatio(est, math.nan, math.nan, math.nan, n, math.nan, k)
    sd = float(d.std(ddof=1))
    if sd == 0.0:  # every seed the same ratio: a point, and p is 0 unless that ratio is 1
        p0 = 1.0 if d[0] == 0 else 0.0
        return LogRatio(est, est, est, p0, n, 0.0, k)
    pv = float(stats.ttest_1samp(d, 0.0).pvalue)
    lo, hi = LogRatio(est, math.nan, math.nan, pv, n, sd, k).interval(confidence)
    return LogRatio(est, lo, hi, pv, n, sd, k)


def ratio(cell: Mapping[str, Mapping], key: str | Callable[[dict], float]) -> LogRatio:
    """`log_ratio_t` of one metric in one cell of per-run rows: ``cell`` is
    ``{"buffer": {seed: row}, "learner": {seed: row}}`` (`analysis.tables.by_cell`), ``key`` a
    row's column or a function of a row."""
    get = key if callable(key) else (lambda r: r[key])
    return log_ratio_t(
        {s: get(r) for s, r in cell["buffer"].items()},
        {s: get(r) for s, r in cell["learner"].items()},
    )


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


# --- time to target as survival (the equal-wall-time plan) ----------------------------------------


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


@dataclass(frozen=True)
class TimeDiff:
    """Time to target in one cell, proposed - existing, in seconds: the difference of restricted
    mean times to target up to ``tau`` over the seeds run in both placements (``n``), its paired
    t-interval and p (module docstring); each placement's RMST and how many of its paired runs
    reached the target by tau."""

    estimate: float
    low: float  # 95% paired t-interval (NaN with fewer than 2 pairs)
    high: float
    p: float  # paired t-test of a difference of 0 (NaN with fewer than 2 pairs)
    n: int
    sd: float = math.nan  # SD of the per-seed differences
    tau: float = math.nan
    rmst_learner: float = math.nan
    rmst_buffer: float = math.nan
    reached_learner: int = 0
    reached_buffer: int = 0
    unpaired: int = 0

    def interval(self, confidence: float) -> tuple[float, float]:
        """The t-interval at another level (the test at 1 - confidence rejects exactly when it
        excludes 0)."""
        from scipy import stats

        if self.n < 2 or not math.isfinite(self.sd):
            return math.nan, math.nan
        half = stats.t.ppf(0.5 + confidence / 2, self.n - 1) * self.sd / math.sqrt(self.n)
        return float(self.estimate - half), float(self.estimate + half)

    def text(self) -> str:
        if self.n < 2:  # one pair has no spread: no interval, not a certainty
            return f"{self.estimate:+.1f} s (no interval, n = {self.n})"
        return f"{self.estimate:+.1f} [{self.low:+.1f}, {self.high:+.1f}] s"


def rmst_paired(
    buffer: Mapping[Any, tuple[float, bool]],
    learner: Mapping[Any, tuple[float, bool]],
    tau: float,
    confidence: float = 0.95,
) -> TimeDiff:
    """``{seed: (time to target, reached)}`` of each placement -> `TimeDiff` (module
    docstring): each run restricted at ``tau``, paired by seed, one paired t procedure for the
    interval and the p."""
    from scipy import stats

    seeds = sorted(set(buffer) & set(learner))

    def restricted(side: Mapping[Any, tuple[float, bool]]) -> tuple[np.ndarray, np.ndarray]:
        t = np.array([float(side[s][0]) for s in seeds])
        hit = np.array([bool(side[s][1]) for s in seeds], bool) & (t <= tau)
        return np.where(hit, t, tau), hit

    (tb, hb), (tl, hl) = restricted(buffer), restricted(learner)
    d = tb - tl
    n = len(seeds)
    base = {
        "tau": float(tau),
        "rmst_learner": float(tl.mean()) if n else math.nan,
        "rmst_buffer": float(tb.mean()) if n else math.nan,
        "reached_learner": int(hl.sum()),
        "reached_buffer": int(hb.sum()),
        "unpaired": len(set(buffer) ^ set(learner)),
    }
    est = float(d.mean()) if n else math.nan
    if n < 2:
        return TimeDiff(est, math.nan, math.nan, math.nan, n, **base)
    sd = float(d.std(ddof=1))
    if sd == 0.0:  # every seed the same difference: a point
        return TimeDiff(est, est, est, 1.0 if est == 0 else 0.0, n, 0.0, **base)
    p = float(stats.ttest_1samp(d, 0.0).pvalue)
    lo, hi = TimeDiff(est, math.nan, math.nan, p, n, sd).interval(confidence)
    return TimeDiff(est, lo, hi, p, n, sd, **base)


def rmst_cell(
    cell: Mapping[str, Mapping], horizon: str, reached: Callable[[dict], bool]
) -> TimeDiff | None:
    """`rmst_paired` on one cell of per-run rows (as `ratio` takes it): each row's
    ``time_to_target_s`` and ``reached(row)``, censored at tau, the shortest run's ``horizon``
    column, so neither placement is credited with the other's longer run. None when a placement
    has no run or a run has no target."""
    rows = {k: list(v.values()) for k, v in cell.items()}
    if not all(rows.values()) or not all(
        math.isfinite(r["target"]) for v in rows.values() for r in v
    ):
        return None
    tau = min(r[horizon] for v in rows.values() for r in v)
    side = {
        k: {s: (r["time_to_target_s"], bool(reached(r))) for s, r in cell[k].items()}
        for k in ("buffer", "learner")
    }
    return rmst_paired(side["buffer"], side["learner"], tau)


# --- bootstrap ratios (the fixed-update appendix) -------------------------------------------------


@dataclass(frozen=True)
class Ratio:
    """num / den (replay_at=buffer / replay_at=learner in the reports) for one metric in one
    cell (see the module docstring)."""

    label: str
    estimate: float  # ratio of geometric means
    low: float  # confidence interval (NaN: none)
    high: float
    confidence: float
    seeds: tuple  # the paired seeds, in order
    num: tuple[float, ...]  # per seed
    den: tuple[float, ...]
    method: str  # "BCa", "percentile (BCa failed)", "degenerate", "one seed", "no seeds"
    unpaired: tuple = ()  # seeds with a value in one placement only (not in the ratio)

    @property
    def n(self) -> int:
        return len(self.seeds)

    @property
    def per_seed(self) -> tuple[float, ...]:
        return tuple(p / e for p, e in zip(self.num, self.den, strict=True))

    @property
    def has_interval(self) -> bool:
        return math.isfinite(self.low) and math.isfinite(self.high)

    def contains(self, x: float) -> bool:
        return self.has_interval and self.low <= x <= self.high

    def above(self, x: float) -> bool:
        return self.has_interval and self.low > x

    def below(self, x: float) -> bool:
        return self.has_interval and self.high < x

    def text(self, digits: int = 3) -> str:
        est = f"{self.estimate:.{digits}g}"
        if not self.has_interval:
            return f"{est} (no interval, n={self.n})"
        return f"{est} [{self.low:.{digits}g}, {self.high:.{digits}g}] (n={self.n})"


def _log_ratio_of_means(lp, le, axis=-1):
    return np.exp(np.mean(lp, axis=axis) - np.mean(le, axis=axis))


def ratio_ci(
    num: Mapping | Sequence,
    den: Mapping | Sequence,
    *,
    seeds: Sequence | None = None,
    label: str = "",
    confidence: float = 0.95,
    n_resamples: int = 9999,
    method: str = "BCa",
    rng: int | None = 0,
) -> Ratio:
    """Ratio of geometric means num / den with a paired bootstrap interval (the reports pass
    replay_at=buffer as ``num``, replay_at=learner as ``den``).

    ``num`` and ``den``: ``{seed: value}`` mappings (paired by seed; a seed missing or
    NaN in one of them is reported in `Ratio.unpaired`), or two sequences of equal length paired
    by position (``seeds`` names them). ``rng``: the bootstrap's seed (fixed by default, so a
    report is reproducible)."""
    from scipy import stats

    used, p, e, unpaired = pair_by_seed(num, den, seeds)
    base = {
        "label": label,
        "confidence": confidence,
        "seeds": tuple(used),
        "num": tuple(p),
        "den": tuple(e),
        "unpaired": tuple(unpaired),
    }
    if not used:
        return Ratio(estimate=math.nan, low=math.nan, high=math.nan, method="no seeds", **base)
    lp, le = np.log(p), np.log(e)
    est = float(_log_ratio_of_means(lp, le))
    if len(used) == 1:
        return Ratio(estimate=est, low=math.nan, high=math.nan, method="one seed", **base)
    d = lp - le
    if np.ptp(d) <= 1e-12 * max(1.0, float(np.max(np.abs(d)))):
        return Ratio(estimate=est, low=est, high=est, method="degenerate", **base)
    used_method = method
    for m in (method, "percentile"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", getattr(stats, "DegenerateDataWarning", Warning))
            res = stats.bootstrap(
                (lp, le),
                _log_ratio_of_means,
                paired=True,
                vectorized=True,
                confidence_level=confidence,
                n_resamples=n_resamples,
                method=m,
                rng=np.random.default_rng(rng),
            )
        lo, hi = float(res.confidence_interval.low), float(res.confidence_interval.high)
        if math.isfinite(lo) and math.isfinite(hi):
            used_method = m if m == method else f"{m} ({method} failed)"
            break
    return Ratio(estimate=est, low=lo, high=hi, method=used_method, **base)


def seed_values(metrics: Sequence[Mapping[str, Any]], key: str) -> dict:
    """``{seed: value}`` of one metric from per-run metric dicts (`analysis.metrics.run_metrics`
    output, which carries ``seed``); None/NaN values are kept as NaN."""
    out = {}
    for m in metrics:
        s = m.get("seed")
        if s in out:
            raise ValueError(f"seed {s} appears twice; one run per seed and placement")
        v = m.get(key)
        out[s] = float(v) if v is not None else math.nan
    return out


# --- the decision rule of the fixed-update appendix -----------------------------------------------


def figure_status(r: Ratio, paper: float) -> str:
    """Where one measured ratio stands against the paper's value (see the module docstring)."""
    if not r.has_interval:
        return "no interval"
    if not (r.above(1) or r.below(1)):
        return "undecided (interval contains 1)"
    if r.above(1) != (paper > 1):
        return "opposite direction"
    if r.contains(paper):
        return "matches"
    mid = math.sqrt(r.low * r.high)  # the whole interval is on one side of the paper's value
    return (
        "same direction, smaller than the paper"
        if abs(math.log(mid)) < abs(math.log(paper))
        else "same direction, larger than the paper"
    )


@dataclass(frozen=True)
class Decision:
    verdict: str  # REPRODUCED, REFUTED or INCONCLUSIVE
    loss: str  # figure_status of each figure
    priority: str
    reason: str


def _opposite(r: Ratio, paper: float) -> bool:
    """The interval lies entirely on the other side of 1 from ``paper``."""
    return r.below(1) if paper > 1 else r.above(1)


def decide(
    loss: Ratio,
    priority: Ratio,
    paper_loss: float = PAPER_LOSS,
    paper_priority: float = PAPER_PRIORITY,
) -> Decision:
    """The decision rule of the module docstring, for one cell."""
    ls, ps = figure_status(loss, paper_loss), figure_status(priority, paper_priority)
    if priority.above(1) and priority.contains(paper_priority) and loss.below(1):
        return Decision(
            REPRODUCED,
            ls,
            ps,
            f"priority {priority.text()} lies above 1 and contains "
            f"{paper_priority:g}; loss {loss.text()} lies below 1",
        )
    against = [
        f"{name} {r.text()} lies on the other side of 1 from the paper's {v:g}"
        for name, r, v in (("priority", priority, paper_priority), ("loss", loss, paper_loss))
        if _opposite(r, v)
    ]
    if against:
        return Decision(REFUTED, ls, ps, "; ".join(against))
    return Decision(INCONCLUSIVE, ls, ps, f"priority: {ps}; loss: {ls}")


# --- censored time to target (the fixed-update appendix) ------------------------------------------


@dataclass(frozen=True)
class TimeToTarget:
    times: tuple[float, ...]  # per seed; inf = not reached within the budget
    budget: float
    reached: int
    fraction: float
    fraction_low: float  # 95% Wilson interval of the fraction
    fraction_high: float
    median: float  # inf = fewer than half reached it ("> budget")

    @property
    def n(self) -> int:
        return len(self.times)

    def median_text(self, fmt: str = "{:.3g}") -> str:
        if not self.n:
            return "n/a"
        return (
            fmt.format(self.median)
            if math.isfinite(self.median)
            else "> " + fmt.format(self.budget)
        )


def time_to_target(times: Sequence[float | None], budget: float) -> TimeToTarget:
    """Fraction reached and censored median of per-seed times to target (module docstring).

    ``times``: one entry per seed, None/NaN/inf or a time > ``budget`` = not reached within the
    budget (a failed run too: pass None, never leave it out)."""
    from scipy import stats

    if not budget > 0:
        raise ValueError(f"budget={budget!r} must be > 0")
    t = np.array(
        [
            math.inf if v is None or not math.isfinite(float(v)) or float(v) > budget else float(v)
            for v in times
        ],
        "f8",
    )
    if np.any(t < 0):
        raise ValueError(f"times {times!r}: a time to target is >= 0")
    n, k = len(t), int(np.isfinite(t).sum())
    if n == 0:
        nan = math.nan
        return TimeToTarget((), float(budget), 0, nan, nan, nan, nan)
    ci = stats.binomtest(k, n).proportion_ci(confidence_level=0.95, method="wilson")
    median = float(np.sort(t)[math.ceil(n / 2) - 1])
    return TimeToTarget(
        tuple(float(x) for x in t), float(budget), k, k / n, float(ci.low), float(ci.high), median
    )


# --- the forest plot ------------------------------------------------------------------------------


def forest_plot(
    ratios: Sequence[Ratio],
    path: str | Path,
    title: str | None = None,
    refs: Mapping[str, float] | None = None,
) -> Path:
    """One row per ratio (top to bottom in the given order): the estimate, its interval, the
    per-seed ratios as dots; log x axis with a line at 1 and dashed lines at ``refs`` (default:
    the paper's 0.26 and 3.92). Written as PNG to ``path`` (Agg canvas, no pyplot)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter

    refs = (
        {"paper: loss 0.26": PAPER_LOSS, "paper: priority 3.92": PAPER_PRIORITY}
        if refs is None
        else dict(refs)
    )
    n = len(ratios)
    labels = [r.label or f"ratio {i}" for i, r in enumerate(ratios)]
    # the plot keeps ~5 inches whatever the labels' length (they sit left of it, the
    # intervals' text right of it)
    label_in = 0.075 * max((len(x) for x in labels), default=10)
    fig = Figure(figsize=(5.0 + label_in + 1.8, 1.2 + 0.42 * max(n, 1)))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    ax.set_xscale("log")
    xs = [1.0, *refs.values()]
    for i, r in enumerate(ratios):
        y = n - 1 - i
        seeds = [v for v in r.per_seed if v > 0]
        xs += seeds
        ax.plot(seeds, [y] * len(seeds), "o", ms=3, color="0.6", zorder=2)
        if r.has_interval:
            ax.plot([r.low, r.high], [y, y], "-", color="C0", lw=2, zorder=3)
            xs += [r.low, r.high]
        if math.isfinite(r.estimate):
            ax.plot([r.estimate], [y], "D", color="C0", ms=6, zorder=4)
            xs.append(r.estimate)
    lo, hi = min(xs) / 1.5, max(xs) * 1.5
    ax.set_xlim(lo, hi)
    ticks = [v for v in (0.01, 0.03, 0.1, 0.26, 0.5, 1, 2, 3.92, 10, 30, 100) if lo <= v <= hi]
    ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.axvline(1.0, color="k", lw=1, zorder=1)
    for j, (name, v) in enumerate(refs.items()):
        ax.axvline(v, color=f"C{j + 1}", ls="--", lw=1, zorder=1, label=name)
    ax.set_yticks(range(n))
    ax.set_yticklabels(labels[::-1])
    ax.set_ylim(-0.7, n - 0.3)
    for i, r in enumerate(ratios):
        ax.annotate(
            r.text(),
            (1.0, n - 1 - i),
            xycoords=("axes fraction", "data"),
            xytext=(6, 0),
            textcoords="offset points",
            va="center",
            fontsize=8,
        )
    ax.set_xlabel(
        "proposed / existing (ratio of geometric means; "
        f"{round((ratios[0].confidence if ratios else 0.95) * 100)}% paired "
        "bootstrap interval; dots: seeds)"
    )
    if refs:
        ax.legend(
            loc="upper center",
            bbox_to_anchor=(0.5, -0.25 if n > 3 else -0.45),
            ncol=len(refs),
            fontsize=8,
            frameon=False,
        )
    if title:
        ax.set_title(title)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    return path
