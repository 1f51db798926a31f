"""Statistics for the verdict on the paper's figures: per-seed ratios, paired bootstrap intervals,
the decision rule, censored time to target, and a forest plot (issue 14, items 3 and 5).

Ratio (`ratio_ci`)
------------------
For a metric with one positive value per run (the loss after convergence, the transferred
priority, ...), the comparison of the placements is

    R = geometric mean over seeds (buffer) / geometric mean over seeds (learner)
      = exp(mean_i log p_i - mean_i log e_i),

so a ratio and its inverse are symmetric, and one outlying seed cannot dominate as it does a
ratio of arithmetic means. Seed ``i`` of one placement is paired with seed ``i`` of the other
(the same seed gives the same environment seeds and the same initial network). The 95%
confidence interval is ``scipy.stats.bootstrap`` over the seeds with ``paired=True``: each
resample draws seeds with replacement and keeps both placements' values of a drawn seed
together, so what the seeds share (an easy or hard seed) cancels in the ratio. The interval
method is BCa (scipy's default); when BCa cannot give one (scipy's degenerate-data warning) the
percentile interval is used and `Ratio.method` says so. Every per-seed value is kept. When
every seed has the same ratio the interval is that ratio (``method = "degenerate"``); one seed
gives no interval (NaN). A seed with a value in only one placement is left out of the ratio and
listed in `Ratio.unpaired`.

Decision rule (`decide`; the fixed-update Plan, docs/results/appendix/fixed-updates.md)
--------------------------------------------------------------------------------
With the paper's figures L = 0.26 (training loss, proposed / existing) and P = 3.92 (average
priority of the transferred experiences, proposed / existing), and the 95% intervals
[lo, hi] of the measured loss ratio and priority ratio in one cell:

* **reproduced**: the priority interval lies above 1 (lo > 1) and contains P (lo <= P <= hi),
  and the loss interval lies below 1 (hi < 1);
* **refuted in this regime**: some interval lies entirely on the other side of 1 from the
  paper's value (priority: hi < 1; loss: lo > 1), so it excludes the paper's value and its
  direction;
* **inconclusive**: anything else (an interval that contains 1, a priority ratio above 1 but
  not containing 3.92, a missing interval).

The two outcomes exclude each other. Each figure also gets a status of its own
(`figure_status`): "matches", "same direction, smaller/larger than the paper", "opposite
direction" or "undecided (interval contains 1)".

Time to target (`time_to_target`)
---------------------------------
A seed that did not reach the target within the budget (or failed, or has no value) counts as
reached after the budget ("> budget"): it is censored, never dropped. Reported: the fraction of
seeds that reached the target (with its 95% Wilson interval, ``scipy.stats.binomtest``) and the
median, defined as the first time by which at least half of the seeds had reached it (the
Kaplan-Meier median; with every censoring at the budget it is the ceil(n/2)-th smallest time);
``inf`` when fewer than half reached it, written "> budget".
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "PAPER_LOSS",
    "PAPER_PRIORITY",
    "Decision",
    "Ratio",
    "TimeToTarget",
    "decide",
    "figure_status",
    "forest_plot",
    "ratio_ci",
    "seed_values",
    "time_to_target",
]

PAPER_LOSS = 0.26
PAPER_PRIORITY = 3.92
REPRODUCED, REFUTED, INCONCLUSIVE = "reproduced", "refuted in this regime", "inconclusive"


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


def _pairs(num, den, seeds) -> tuple[list, list[float], list[float], list]:
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

    def ok(v) -> bool:
        return v is not None and math.isfinite(float(v))

    used, pv, ev, unpaired = [], [], [], []
    for k, a, b in zip(keys, p, e, strict=True):
        if ok(a) and ok(b):
            if float(a) <= 0 or float(b) <= 0:
                raise ValueError(
                    f"seed {k}: num={a}, den={b}; a ratio of geometric means needs positive values"
                )
            used.append(k)
            pv.append(float(a))
            ev.append(float(b))
        elif ok(a) or ok(b):
            unpaired.append(k)
    return used, pv, ev, unpaired


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

    used, p, e, unpaired = _pairs(num, den, seeds)
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


# --- the decision rule --------------------------------------------------------------------------


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


# --- time to target -----------------------------------------------------------------------------


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


# --- the forest plot ----------------------------------------------------------------------------


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
