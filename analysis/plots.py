"""Plots: the time series of one link profile (one curve per placement, seeds as a band), and
the paper report's return against link MB and loss and priority curves against updates.

Every run's series is first put on a common time grid (seconds since the learner's loop start,
see `analysis.runs`; bins of equal width over the longest run of the profile):

- event series (loss per update, priority per transfer, returns per eval or episode): the mean
  of the rows that fall in each bin (weighted by ``n`` for transfers), bins without rows filled by
  linear interpolation between their neighbours, NaN outside the run's own first..last row;
- byte counters (``link``): the cumulative byte count interpolated at the bin edges,
  differenced, divided by the bin width (bytes/s), NaN outside the run's span.

Across the seeds of a placement: the median is the line, min..max the band (at each grid point,
over the seeds that have data there).

matplotlib is imported only when drawing (the project's optional ``analysis`` extra). Figures are
drawn on the Agg canvas directly (no pyplot, no display, and the caller's backend is left as is).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from analysis.cells import PAPER_TERM
from analysis.metrics import link_mb_at
from analysis.runs import Run

__all__ = [
    "ForestRow",
    "band",
    "binned_mean",
    "common_grid",
    "counter_rate",
    "curves",
    "plot_curves",
    "plot_forest",
    "plot_profile",
    "plot_return_vs_link",
]

Series = tuple[np.ndarray, np.ndarray, np.ndarray | None]  # t, y, weights


def common_grid(t_end: float, max_bins: int = 120, min_width: float = 1.0) -> np.ndarray:
    """Bin edges from 0 to ``t_end``: at most ``max_bins`` bins, at least ``min_width`` s wide."""
    t_end = max(float(t_end), min_width)
    nb = int(np.clip(t_end // min_width, 1, max_bins))
    return np.linspace(0.0, t_end, nb + 1)


def binned_mean(
    t: np.ndarray, y: np.ndarray, edges: np.ndarray, w: np.ndarray | None = None
) -> np.ndarray:
    """Mean of ``y`` (weighted by ``w``) per bin; empty bins inside the data's time span are
    interpolated from their neighbours, bins outside it are NaN."""
    t, y = np.asarray(t, "f8"), np.asarray(y, "f8")
    w = np.ones_like(y) if w is None else np.asarray(w, "f8")
    ok = np.isfinite(t) & np.isfinite(y) & (w > 0) & (t >= edges[0]) & (t <= edges[-1])
    t, y, w = t[ok], y[ok], w[ok]
    nb = len(edges) - 1
    out = np.full(nb, np.nan)
    if not len(t):
        return out
    idx = np.clip(np.searchsorted(edges, t, side="right") - 1, 0, nb - 1)
    sw = np.bincount(idx, w, nb)
    swy = np.bincount(idx, w * y, nb)
    full = sw > 0
    centers = (edges[:-1] + edges[1:]) / 2
    out[full] = swy[full] / sw[full]
    first, last = idx.min(), idx.max()
    inside = np.arange(nb)
    inside = (inside >= first) & (inside <= last)
    gaps = inside & ~full
    if gaps.any():
        out[gaps] = np.interp(centers[gaps], centers[full], out[full])
    return out


def counter_rate(
    t: np.ndarray, amount: np.ndarray, interval: np.ndarray | None, edges: np.ndarray
) -> np.ndarray:
    """Rate (amount/s) per bin from rows "``amount`` in the ``interval`` s ending at ``t``"."""
    t, amount = np.asarray(t, "f8"), np.asarray(amount, "f8")
    nb = len(edges) - 1
    if not len(t):
        return np.full(nb, np.nan)
    iv = np.asarray(interval, "f8") if interval is not None and len(interval) else None
    start = float(t.min() - (iv[np.argmin(t)] if iv is not None else 0.0))
    tu, inv = np.unique(t, return_inverse=True)  # rows of several buffers share a t
    tc = np.concatenate([[start], tu])
    cum = np.concatenate([[0.0], np.cumsum(np.bincount(inv, amount, len(tu)))])
    c_edges = np.interp(edges, tc, cum)
    rate = np.diff(c_edges) / np.diff(edges)
    covered = (edges[1:] > tc[0]) & (edges[:-1] < tc[-1])
    rate[~covered] = np.nan
    return rate


def band(curves: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Median, min and max over curves at each grid point, ignoring NaN (NaN where all are)."""
    a = np.vstack(curves)
    has = np.isfinite(a).any(axis=0)
    med, lo, hi = (np.full(a.shape[1], np.nan) for _ in range(3))
    if has.any():
        med[has] = np.nanmedian(a[:, has], axis=0)
        lo[has] = np.nanmin(a[:, has], axis=0)
        hi[has] = np.nanmax(a[:, has], axis=0)
    return med, lo, hi


# --- what each plot shows: run -> curve on the grid ------------------------------------------


def _loss(run: Run, edges: np.ndarray) -> np.ndarray:
    u = run.learner.stream("updates")
    return binned_mean(u.get("t", []), u.get("loss", []), edges)


def _prio(field: str) -> Callable[[Run, np.ndarray], np.ndarray]:
    def f(run: Run, edges: np.ndarray) -> np.ndarray:
        x = run.learner.stream("transfers")
        return binned_mean(x.get("t", []), x.get(field, []), edges, x.get("n"))

    return f


def _eval(run: Run, edges: np.ndarray) -> np.ndarray:
    e = run.learner.stream("evals")
    return binned_mean(e.get("t", []), e.get("ret_mean", []), edges)


def _episodes(run: Run, edges: np.ndarray) -> np.ndarray:
    e = run.episodes()
    return binned_mean(e["t"], e["ret"], edges)


def _link(direction: str) -> Callable[[Run, np.ndarray], np.ndarray]:
    def f(run: Run, edges: np.ndarray) -> np.ndarray:
        lk = run.learner.stream("link")
        return (
            counter_rate(lk.get("t", []), lk.get(direction, []), lk.get("interval_s"), edges) / 1e6
        )

    return f


XLABEL = "time since the learner's loop start (s)"
PALETTE = ["tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown"]


def _draw(
    ax,
    groups: dict[str, list[Run]],
    edges: np.ndarray,
    curve,
    colors: dict[str, str],
    style: str = "-",
    suffix: str = "",
    band_alpha: float = 0.2,
) -> None:
    x = (edges[:-1] + edges[1:]) / 2
    for label, runs in groups.items():
        med, lo, hi = band([curve(r, edges) for r in runs])
        if not np.isfinite(med).any():
            continue
        c = colors[label]
        ax.plot(x, med, style, color=c, lw=1.5, label=f"{label}{suffix} (n={len(runs)})")
        ax.fill_between(x, lo, hi, color=c, alpha=band_alpha, lw=0)


def plot_profile(
    title: str,
    groups: dict[str, list[Run]],
    out_dir: str | Path,
    slug: str,
    conv_t: dict[str, float] | None = None,
) -> dict[str, Path]:
    """Write ``<slug>-{loss,priority,return,link}.png`` into ``out_dir``; returns name -> path.

    ``groups``: placement label -> runs (seeds). ``conv_t``: placement label -> median time the
    after-convergence window starts (a dotted line on the loss plot).
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    def subplots():
        fig = Figure(figsize=(7, 4))
        FigureCanvasAgg(fig)
        return fig, fig.subplots()

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    t_end = max(
        (float(r.summary.get("wall_s") or 0.0) for rs in groups.values() for r in rs), default=0.0
    )
    for rs in groups.values():
        for r in rs:
            for s in r.learner.streams.values():
                if len(s.get("t", ())):
                    t_end = max(t_end, float(s["t"][-1]))
    edges = common_grid(t_end)
    colors = {g: PALETTE[i % len(PALETTE)] for i, g in enumerate(groups)}
    written = {}

    def save(fig, name: str) -> None:
        path = out_dir / f"{slug}-{name}.png"
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        written[name] = path

    fig, ax = subplots()
    _draw(ax, groups, edges, _loss, colors)
    for label, t in (conv_t or {}).items():
        if label in colors and np.isfinite(t):
            ax.axvline(t, color=colors[label], ls=":", lw=1)
    ax.set(
        title=f"training loss: {title}", xlabel=XLABEL, ylabel="loss (weighted Huber, mean per bin)"
    )
    if ax.lines and all((ln.get_ydata() > 0).any() for ln in ax.lines if ln.get_ls() == "-"):
        ax.set_yscale("log")  # the first updates' loss dwarfs the rest on a linear axis
    ax.text(
        0.99,
        0.01,
        "dotted: after-convergence window starts (median over seeds)",
        transform=ax.transAxes,
        ha="right",
        va="bottom",
        fontsize=7,
        color="0.4",
    )
    ax.legend(fontsize=8)
    save(fig, "loss")

    fig, ax = subplots()
    _draw(ax, groups, edges, _prio("priority_mean"), colors, "-", ": held by sender")
    _draw(
        ax,
        groups,
        edges,
        _prio("arrival_priority_mean"),
        colors,
        "--",
        ": on arrival",
        band_alpha=0.1,
    )
    ax.set(
        title=f"transferred priority: {title}",
        xlabel=XLABEL,
        ylabel="mean priority (|td|+eps)^alpha, weighted by n",
    )
    ax.legend(fontsize=8)
    save(fig, "priority")

    fig, ax = subplots()
    _draw(ax, groups, edges, _eval, colors, "-", ": greedy eval")
    _draw(ax, groups, edges, _episodes, colors, "--", ": actors' episodes", band_alpha=0.1)
    ax.set(title=f"return: {title}", xlabel=XLABEL, ylabel="return")
    ax.legend(fontsize=8)
    save(fig, "return")

    fig, ax = subplots()
    _draw(ax, groups, edges, _link("bytes_in"), colors, "-", ": toward learner")
    _draw(ax, groups, edges, _link("bytes_out"), colors, "--", ": toward buffers", band_alpha=0.1)
    ax.set(
        title=f"link throughput: {title}", xlabel=XLABEL, ylabel="MB/s (learner side, all buffers)"
    )
    ax.legend(fontsize=8)
    save(fig, "link")
    return written


# --- the paper report's figures ----------------------------------------------------------------


def plot_return_vs_link(title: str, runs: list[Run], path: Path) -> Path:
    """Greedy return against cumulative link MB, one line per run (colour: placement)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 4))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    seen = set()
    for r in runs:
        ev = r.learner.stream("evals")
        if not len(ev.get("t", ())):
            continue
        color = {"learner": "C0", "buffer": "C1"}.get(r.replay_at, "C2")
        name = PAPER_TERM.get(r.replay_at, r.replay_at)
        ax.plot(
            link_mb_at(r, ev["t"]),
            ev["ret_mean"],
            "-",
            color=color,
            lw=1,
            alpha=0.8,
            label=None if name in seen else name,
        )
        seen.add(name)
    ax.set_xlabel("cumulative link MB (both directions)")
    ax.set_ylabel("greedy return")
    ax.set_title(title)
    if seen:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return path


CURVES = [  # (stream, x field, y field, weight field, axis label)
    ("evals", "update", "reference_loss", None, "reference loss"),
    ("updates", "update", "loss", None, "training loss (weighted)"),
    ("transfers", "update", "priority_mean", "n", "transferred priority (held by sender)"),
]


def curves(runs: list[Run], bins: int = 40) -> tuple[np.ndarray, dict]:
    """Per placement and curve: (median, 25th, 75th percentile) across seeds on a common grid
    of learner updates (bin centres; each run's rows averaged per bin, weighted by ``n`` for
    transfers, gaps inside a run's span interpolated: `binned_mean`)."""
    top = max(
        (float(np.max(u)) for r in runs if len(u := r.learner.stream("updates").get("update", ()))),
        default=0.0,
    )
    edges = np.linspace(0.0, max(top, 1.0), bins + 1)
    out: dict = {}
    for stream, xk, yk, wk, _ in CURVES:
        for place in ("learner", "buffer"):
            rows = []
            for r in (r for r in runs if r.replay_at == place):
                s = r.learner.stream(stream)
                if len(s.get(xk, ())) and yk in s:
                    rows.append(binned_mean(s[xk], s[yk], edges, s.get(wk) if wk else None))
            if rows:
                a = np.vstack(rows)
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN bins
                    out[(yk, place)] = tuple(np.nanpercentile(a, q, axis=0) for q in (50, 25, 75))
    return (edges[:-1] + edges[1:]) / 2, out


def plot_curves(title: str, runs: list[Run], path: Path) -> Path:
    """Reference loss, training loss and transferred priority against learner updates: median
    across seeds (line) and interquartile range (band) per placement."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    x, cv = curves(runs)
    fig = Figure(figsize=(12, 3.6))
    FigureCanvasAgg(fig)
    for i, (_, _, yk, _, label) in enumerate(CURVES):
        ax = fig.add_subplot(1, len(CURVES), i + 1)
        for place, color in (("learner", "C0"), ("buffer", "C1")):
            if (yk, place) not in cv:
                continue
            med, lo, hi = cv[(yk, place)]
            ax.plot(x, med, color=color, label=PAPER_TERM[place])
            ax.fill_between(x, lo, hi, color=color, alpha=0.25, lw=0)
        ax.set_xlabel("learner updates")
        ax.set_title(label, fontsize=9)
        if i == 0:
            ax.legend(fontsize=8)
    fig.suptitle(f"{title}: median and IQR across seeds", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return path


# --- the forest plot of a family of tests --------------------------------------------------------


@dataclass(frozen=True)
class ForestRow:
    """One (cell, outcome) of a family: its point, its interval (NaN: none), the paper's value
    where the paper gives one, and its unit: ``"ratio"`` (proposed / existing, no effect at 1,
    log axis) or ``"s"`` (proposed - existing in seconds, no effect at 0)."""

    label: str
    estimate: float
    low: float
    high: float
    paper: float | None = None
    unit: str = "ratio"
    margin: float | None = None  # a pre-registered margin, drawn as a red bar


def plot_forest(
    rows: Sequence[ForestRow],
    path: Path,
    title: str = "",
    xlabels: dict[str, str] | None = None,
) -> Path:
    """A forest plot of ``rows``, top to bottom in their order: one panel per unit (ratios on a
    log axis, differences in seconds on a linear one), each row's point and interval, a line at
    no effect (1 or 0), the paper's value as a red cross and a margin as a red bar where a row
    has one. ``xlabels``: each unit's axis label (default: proposed against existing, 95%).
    PNG at ``path``."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter

    units = [u for u in ("ratio", "s") if any(r.unit == u for r in rows)] or ["ratio"]
    per = {u: [r for r in rows if r.unit == u] for u in units}
    tallest = max(len(v) for v in per.values())
    label_in = 0.07 * max((len(r.label) for r in rows), default=10)
    fig = Figure(figsize=((label_in + 4.5) * len(units), 1.3 + 0.32 * max(tallest, 1)))
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, len(units), squeeze=False)[0]
    for ax, u in zip(axes, units, strict=True):
        rs = per[u]
        n = len(rs)
        none = 1.0 if u == "ratio" else 0.0
        if u == "ratio":
            ax.set_xscale("log")
        xs = [none]
        labelled: set[str] = set()  # a legend entry once per kind of mark
        for i, r in enumerate(rs):
            y = n - 1 - i
            if math.isfinite(r.low) and math.isfinite(r.high):
                ax.plot([r.low, r.high], [y, y], "-", color="C0", lw=2)
                xs += [r.low, r.high]
            if math.isfinite(r.estimate):
                ax.plot([r.estimate], [y], "D", color="C0", ms=5)
                xs.append(r.estimate)
            for kind, v, marker, ms in (("paper", r.paper, "x", 8), ("margin", r.margin, "|", 12)):
                if v is not None and math.isfinite(v):
                    label = None if kind in labelled else kind
                    ax.plot([v], [y], marker, color="tab:red", ms=ms, mew=2, label=label)
                    xs.append(v)
                    labelled.add(kind)
        ax.axvline(none, color="k", lw=1)
        xs = [x for x in xs if math.isfinite(x) and (u != "ratio" or x > 0)]
        lo, hi = min(xs), max(xs)
        if u == "ratio":
            lo, hi = lo / 1.3, hi * 1.3
            ax.set_xlim(lo, hi)
            marks = {r.margin for r in rs if r.margin is not None and math.isfinite(r.margin)}
            ticks = sorted(
                v
                for v in {0.01, 0.03, 0.1, 0.26, 0.5, 1, 2, 3.92, 10, 30, 100} | marks
                if lo <= v <= hi
            )
            ax.xaxis.set_major_locator(FixedLocator(ticks))
            ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
            ax.xaxis.set_minor_formatter(NullFormatter())
        else:
            pad = 0.08 * (hi - lo or 1.0)
            ax.set_xlim(lo - pad, hi + pad)
        ax.set_yticks(range(n))
        ax.set_yticklabels([r.label for r in rs][::-1], fontsize=8)
        ax.set_ylim(-0.7, n - 0.3)
        default = (
            "proposed / existing, 95% interval"
            if u == "ratio"
            else "proposed - existing (s), 95% interval"
        )
        ax.set_xlabel((xlabels or {}).get(u, default))
        if labelled:
            ax.legend(loc="best", fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=90)
    return path
