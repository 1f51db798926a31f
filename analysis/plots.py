"""Time-series plots of one link profile: one curve per placement, seeds as a band.

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

from collections.abc import Callable
from pathlib import Path

import numpy as np

from analysis.runs import Run

__all__ = ["band", "binned_mean", "common_grid", "counter_rate", "plot_profile"]

Series = tuple[np.ndarray, np.ndarray, np.ndarray | None]  # t, y, weights


def common_grid(t_end: float, max_bins: int = 120, min_width: float = 1.0) -> np.ndarray:
    """Bin edges from 0 to ``t_end``: at most ``max_bins`` bins, at least ``min_width`` s wide."""
    t_end = max(float(t_end), min_width)
    nb = int(np.clip(t_end // min_width, 1, max_bins))
    return np.linspace(0.0, t_end, nb + 1)


def binned_mean(t: np.ndarray, y: np.ndarray, edges: np.ndarray,
                w: np.ndarray | None = None) -> np.ndarray:
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


def counter_rate(t: np.ndarray, amount: np.ndarray, interval: np.ndarray | None,
                 edges: np.ndarray) -> np.ndarray:
    """Rate (amount/s) per bin from rows "``amount`` in the ``interval`` seconds ending at ``t``"."""
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
        return counter_rate(lk.get("t", []), lk.get(direction, []), lk.get("interval_s"),
                            edges) / 1e6
    return f


XLABEL = "time since the learner's loop start (s)"
PALETTE = ["tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown"]


def _draw(ax, groups: dict[str, list[Run]], edges: np.ndarray, curve, colors: dict[str, str],
          style: str = "-", suffix: str = "", band_alpha: float = 0.2) -> None:
    x = (edges[:-1] + edges[1:]) / 2
    for label, runs in groups.items():
        med, lo, hi = band([curve(r, edges) for r in runs])
        if not np.isfinite(med).any():
            continue
        c = colors[label]
        ax.plot(x, med, style, color=c, lw=1.5, label=f"{label}{suffix} (n={len(runs)})")
        ax.fill_between(x, lo, hi, color=c, alpha=band_alpha, lw=0)


def plot_profile(title: str, groups: dict[str, list[Run]], out_dir: str | Path, slug: str,
                 conv_t: dict[str, float] | None = None) -> dict[str, Path]:
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
    t_end = max((float(r.summary.get("wall_s") or 0.0) for rs in groups.values() for r in rs),
                default=0.0)
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
    ax.set(title=f"training loss: {title}", xlabel=XLABEL,
           ylabel="loss (weighted Huber, mean per bin)")
    if ax.lines and all((ln.get_ydata() > 0).any() for ln in ax.lines if ln.get_ls() == "-"):
        ax.set_yscale("log")  # the first updates' loss dwarfs the rest on a linear axis
    ax.text(0.99, 0.01, "dotted: after-convergence window starts (median over seeds)",
            transform=ax.transAxes, ha="right", va="bottom", fontsize=7, color="0.4")
    ax.legend(fontsize=8)
    save(fig, "loss")

    fig, ax = subplots()
    _draw(ax, groups, edges, _prio("priority_mean"), colors, "-", ": held by sender")
    _draw(ax, groups, edges, _prio("arrival_priority_mean"), colors, "--", ": on arrival",
          band_alpha=0.1)
    ax.set(title=f"transferred priority: {title}", xlabel=XLABEL,
           ylabel="mean priority (|td|+eps)^alpha, weighted by n")
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
    _draw(ax, groups, edges, _link("bytes_out"), colors, "--", ": toward buffers",
          band_alpha=0.1)
    ax.set(title=f"link throughput: {title}", xlabel=XLABEL,
           ylabel="MB/s (learner side, all buffers)")
    ax.legend(fontsize=8)
    save(fig, "link")
    return written
