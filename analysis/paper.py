"""The paper report: per cell of the sweep (`analysis.cells`, ``by="sweep"``), every metric's
per-seed values in both placements, the ratio ``replay_at=buffer`` / ``replay_at=learner`` (the
paper's proposed / existing) with its paired interval, censored time to target, the decision
rule, and the crossover map (docs/results/appendix/fixed-updates.md, Plan).

Writes ``paper.md``, ``paper-cells.csv`` (every run's metrics), ``paper-forest.png``,
``paper-<cell>-return-vs-link.png`` and ``paper-<cell>-curves.png`` into the report folder.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from analysis import metrics as M
from analysis import stats as S
from analysis.cells import PAPER_TERM, Cell, group, slugify
from analysis.runs import load_experiment
from analysis.stats import DECIDING
from analysis.tables import md_table, num, sort_key, write_csv

__all__ = [
    "CELL_METRICS",
    "DECIDING",
    "analyse_cell",
    "cell_table",
    "crossover_map",
    "deciding",
    "headline",
    "paper_report",
]

# (metric key, label, in the forest plot): ratios buffer / learner, geometric means
CELL_METRICS = [
    ("ref_loss", "reference loss (window)", True),
    ("prio_held", "transferred priority, held by sender (window)", True),
    ("prio_per_mb", "priority delivered per MB", True),
    ("prio_msg_median", "per-message priority median", False),
    ("prio_msg_p90", "per-message priority p90", False),
    ("arrival_prio", "priority on arrival (subsample)", False),
    ("train_loss", "training loss, weighted (window)", False),
    ("batch_td", "batch mean \\|td\\| (window)", False),
    ("return_per_mb", "greedy return per link MB", False),
]
# The columns of paper-cells.csv.
CSV_FIELDS = (
    "cell",
    "run",
    "replay_at",
    "seed",
    "window_start_update",
    "delivered_fraction",
    "ref_loss",
    "train_loss",
    "batch_td",
    "prio_held",
    "prio_msg_median",
    "prio_msg_p90",
    "prio_per_mb",
    "arrival_prio",
    "arrival_td",
    "link_mb",
    "return_window",
    "return_per_mb",
    "target",
    "wall_s",
    "updates",
    "time_to_target_s",
    "updates_to_target",
    "link_mb_to_target",
)


def _budget_s(runs: list) -> float:
    """The time budget that censors time to target: config max_seconds when every run has one,
    else the longest run's wall time."""
    ms = [float(r.config.get("max_seconds") or 0) for r in runs]
    if ms and all(m > 0 for m in ms):
        return max(ms)
    return max((float(r.summary.get("wall_s") or 0) for r in runs), default=1.0) or 1.0


def _run_end(m: dict, key: str, fallback: float) -> float:
    """Where a run ended (``wall_s`` or ``updates`` of its summary); ``fallback`` for a run
    without one (it failed before writing its summary)."""
    v = m.get(key)
    return float(v) if v is not None and np.isfinite(float(v)) and float(v) > 0 else fallback


def analyse_cell(c: Cell, target: float | None = None) -> Cell:
    """Fill in ``c``: per-seed metrics of both placements, every ratio with its paired interval,
    censored time to target, the decision rule and the crossover verdicts."""
    for g in c.groups:
        g.metrics = [M.run_metrics(r, target=target) for r in g.runs]
    c.budget_s = _budget_s(c.runs)
    by = {place: c.at(place) for place in ("learner", "buffer")}
    for k, label, _ in CELL_METRICS:
        c.ratios[k] = S.ratio_ci(
            S.seed_values(by["buffer"], k),
            S.seed_values(by["learner"], k),
            label=f"{c.label}: {label}",
        )
    # time (and updates) to target, a seed that did not reach it censored at its own run's end:
    # the most it could have taken as far as the run shows, so the censoring favours the
    # placement that failed and a win is conservative (max_seconds would not be: a run stopped
    # by its update budget long before it would count as having needed max_seconds)
    for place, ms in by.items():
        ends = [_run_end(m, "wall_s", c.budget_s) for m in ms]
        c.ttt[place] = S.time_to_target(
            [m["time_to_target_s"] for m in ms], max(ends, default=c.budget_s)
        )
    n_budget = max(
        (_run_end(m, "updates", 0.0) for ms in by.values() for m in ms), default=0.0
    ) or float("nan")
    # no seed of either placement reached the target (MinAtar has none): every value would be a
    # run's length, so there is no ratio to give, not a ratio of run lengths
    reached = any(m["time_to_target_s"] is not None for ms in by.values() for m in ms)
    for key, unit, end, fallback in (
        ("time_to_target_s", "time_to_target", "wall_s", c.budget_s),
        ("updates_to_target", "updates_to_target", "updates", n_budget),
    ):
        censored = {
            place: {
                m["seed"]: (float(m[key]) if m[key] is not None else _run_end(m, end, fallback))
                for m in ms
            }
            if reached
            else {}
            for place, ms in by.items()
        }
        c.ratios[unit] = S.ratio_ci(
            censored["buffer"],
            censored["learner"],
            label=f"{c.label}: {unit.replace('_', ' ')} (censored)",
        )
    c.decision = S.decide(c.ratios["ref_loss"], c.ratios["prio_held"])
    c.crossover = {
        "time to target": (
            _winner(c.ratios["time_to_target"], lower_is_better=True)
            if reached
            else "neither reached the target (no winner: every seed censored at its run's end)"
        ),
        "return per MB": _winner(c.ratios["return_per_mb"], lower_is_better=False),
    }
    return c


def _winner(r: Any, lower_is_better: bool) -> str:
    """Which placement wins a cell on one ratio buffer / learner: the one its interval
    favours when the interval excludes 1, else "no clear winner"."""
    if r.below(1):
        w = "buffer" if lower_is_better else "learner"
    elif r.above(1):
        w = "learner" if lower_is_better else "buffer"
    else:
        return f"no clear winner ({r.text()})"
    return f"{PAPER_TERM[w]} ({r.text()})"


def _vals(ms: list[dict], key: str) -> str:
    return ", ".join(
        f"{m['seed']}: {num(m[key]) if m[key] is not None else 'n/a'}"
        for m in sorted(ms, key=lambda m: str(m["seed"]))
    )


def deciding(c: Cell) -> bool:
    """The cell is in the paper's regime: the median delivered fraction of its
    replay_at=learner runs is below `DECIDING` (docs/results/appendix/fixed-updates.md, Plan)."""
    v = [m["delivered_fraction"] for m in c.at("learner") if np.isfinite(m["delivered_fraction"])]
    return bool(v) and float(np.median(v)) < DECIDING


def headline(cells: list[Cell]) -> str:
    """The verdict over the deciding cells: "reproduced" or "refuted in this regime" only when
    every deciding cell says so, else "holds only where ..." naming the cells that reproduce."""
    dec = [c for c in cells if deciding(c)]
    if not dec:
        return (
            f"no cell is in the paper's regime (the existing placement delivered >= "
            f"{DECIDING:.0%} of production everywhere): no verdict"
        )
    verdicts = {c.decision.verdict for c in dec}
    names = ", ".join(c.label for c in dec)
    if verdicts == {S.REPRODUCED}:
        return f"**reproduced** in every deciding cell ({names})"
    if verdicts == {S.REFUTED}:
        return f"**refuted in this regime** in every deciding cell ({names})"
    yes = [c.label for c in dec if c.decision.verdict == S.REPRODUCED]
    others = "; ".join(
        f"{c.label}: {c.decision.verdict}" for c in dec if c.decision.verdict != S.REPRODUCED
    )
    if not yes:  # nothing reproduced and not everything refuted: no claim either way
        return f"**inconclusive**: no deciding cell reproduces it ({others})"
    return f"**holds only where** {'; '.join(yes)} (the other deciding cells: {others})"


def cell_table(c: Cell) -> str:
    """Markdown: every metric's per-seed values in each placement and the ratio with its CI."""
    ml, mb = c.at("learner"), c.at("buffer")
    rows = []
    for k, label, _ in CELL_METRICS:
        r = c.ratios[k]
        rows.append([label, _vals(ml, k), _vals(mb, k), r.text(), r.method])
    r, tl, tb = c.ratios["time_to_target"], c.ttt["learner"], c.ttt["buffer"]
    rows.append(
        [
            "time to target (s; a seed that did not reach it: censored at its run's end)",
            f"{_vals(ml, 'time_to_target_s')}; reached {tl.reached}/{tl.n}, median "
            f"{tl.median_text()}",
            f"{_vals(mb, 'time_to_target_s')}; reached {tb.reached}/{tb.n}, median "
            f"{tb.median_text()}",
            r.text(),
            r.method,
        ]
    )
    r = c.ratios["updates_to_target"]
    rows.append(
        [
            "updates to target (censored at the run's updates)",
            _vals(ml, "updates_to_target"),
            _vals(mb, "updates_to_target"),
            r.text(),
            r.method,
        ]
    )
    rows.append(
        ["delivered fraction of production (existing)", _vals(ml, "delivered_fraction"), "", "", ""]
    )
    head = [
        "metric",
        "existing (seed: value)",
        "proposed (seed: value)",
        "proposed / existing [95% CI]",
        "CI method",
    ]
    d = c.decision
    regime = (
        "deciding (the paper's regime)"
        if deciding(c)
        else f"not deciding (existing delivered >= {DECIDING:.0%})"
    )
    return md_table(head, rows) + f"\nDecision: **{d.verdict}** ({d.reason}); {regime}.\n"


def crossover_map(cells: list[Cell]) -> str:
    """Markdown: per cell, which placement wins on time to target and on return per MB; as a
    grid when the cells have exactly two axes (rows: the first, columns: the second)."""
    axes = {tuple(k for k, _ in c.key) for c in cells}
    if len(axes) == 1 and len(next(iter(axes))) == 2:
        a, b = next(iter(axes))
        rows = sorted({c.key[0][1] for c in cells}, key=sort_key)
        cols = sorted({c.key[1][1] for c in cells}, key=sort_key)
        at = {(c.key[0][1], c.key[1][1]): c for c in cells}
        grid = []
        for rv in rows:
            line = [rv]
            for cv in cols:
                c = at.get((rv, cv))
                line.append(
                    "" if c is None else "<br>".join(f"{k}: {v}" for k, v in c.crossover.items())
                )
            grid.append(line)
        return md_table([f"{a} \\ {b}", *cols], grid)
    return md_table(
        ["cell", "time to target", "return per MB"],
        [[c.label, c.crossover["time to target"], c.crossover["return per MB"]] for c in cells],
    )


def paper_report(
    exp_dir: str | Path, report: str | Path, target: float | None = None, plots: bool = True
) -> list[Cell]:
    """The fixed-update Plan's report (docs/results/appendix/fixed-updates.md) from the HDF5
    files under ``exp_dir`` into ``report`` (the files: module docstring)."""
    from analysis.plots import plot_curves, plot_return_vs_link

    exp_dir, report = Path(exp_dir), Path(report)
    runs, errors = load_experiment(exp_dir)
    report.mkdir(parents=True, exist_ok=True)
    cells = [analyse_cell(c, target) for c in group(runs, exp_dir, by="sweep")]
    lines = [
        "# The paper experiment: proposed / existing per cell",
        "",
        f"Experiment `{exp_dir}`: {len(runs)} runs in {len(cells)} cell(s). Metric "
        "definitions: `analysis.metrics.run_metrics`; ratios, intervals, the decision "
        "and censoring: `analysis.stats` (docs/results/appendix/fixed-updates.md, Plan).",
        "",
    ]
    if errors:
        lines += ["**Unreadable run folders:**", "", *[f"- {e}" for e in errors], ""]
    lines += [
        "## Verdict",
        "",
        headline(cells),
        "",
        "## Crossover map",
        "",
        crossover_map(cells),
        "",
    ]
    forest = [c.ratios[k] for c in cells for k, _, f in CELL_METRICS if f]
    if plots and forest:
        S.forest_plot(forest, report / "paper-forest.png", title="proposed / existing per cell")
        lines += ["![forest plot](paper-forest.png)", ""]
    order = {id(r): i for i, r in enumerate(runs)}  # the plots draw the runs as found
    for c in cells:
        lines += [f"## {c.label}", "", cell_table(c), ""]
        if plots:
            rs = sorted(c.runs, key=lambda r: order[id(r)])
            png = plot_return_vs_link(
                c.label, rs, report / f"paper-{slugify(c.label)}-return-vs-link.png"
            )
            lines += [f"![return vs link MB: {c.label}]({png.name})", ""]
            png = plot_curves(c.label, rs, report / f"paper-{slugify(c.label)}-curves.png")
            lines += [f"![loss and priority curves: {c.label}]({png.name})", ""]
    write_csv(
        report / "paper-cells.csv",
        [{"cell": c.label, **m} for c in cells for g in c.groups for m in g.metrics],
        CSV_FIELDS,
    )
    (report / "paper.md").write_text("\n".join(lines) + "\n")
    return cells
