"""Stage 0 of experiments/placement-3/plan.md, by its two rules only: T per rho, and whether
stage 1 runs.  Not part of any decision about the placements.

    python -m mpirl.sweep experiments/placement-3/pilot.toml          # exports its rows
    python experiments/placement3_pilot.py [--data DIR] [--update docs/results.md]

Reads the exported rows (``DIR/runs.csv``, ``DIR/curves.csv``; default the spec's export,
``docs/results/data/placement-3/pilot``):

1. **T per rho** (`choose_t`): the candidates are the map's T for that rho (`MAP_T`) times
   1, 1.25 and 1.5 (`CANDIDATES`); the pilot ran 1.5x.  At a candidate T', a run's curve has
   flattened when g = mean return over [0.75 T', T'] / mean over [0.5 T', 0.75 T') is within
   `FLAT` (5%) of 1 (the held greedy return on the export's grid, `analysis.export`); the
   candidate is taken when, in every pilot cell of that rho and every arm, the median run's g
   is.  None flattened at 1.5x: the table says so and T stays 1.5x (the plan names no larger
   candidate: a longer T would be a new plan).
2. **Whether stage 1 runs** (`stage1`): no, if in any pilot cell thinned's median return AUC
   (over the pilot's whole T) is below `FLOOR` (0.8) x the learner arm's median.

Beside them, described: each arm's median link MB, delivered fraction, updates/s, trained
|td| / uniform |td| (`uniform_td`, what prioritized sampling concentrates, the same figure in
every arm), and the importance-weighted loss / the unweighted loss over [T/2, T] (the mean
weight a trained transition's gradient carries: thinned's weights hold the extra factor
(f_i / f_min)^-beta, the step-size cost plan.md names as the design's risk).
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

DATA = ROOT / "docs" / "results" / "data" / "placement-3" / "pilot"
SPEC = ROOT / "experiments" / "placement-3" / "pilot.toml"
ARMS = ("learner", "buffer", "thinned")
#: the committed map's T per rho (experiments/equal-time/map.toml)
MAP_T = {0.25: 240.0, 1.0: 90.0, 4.0: 90.0}
CANDIDATES = (1.0, 1.25, 1.5)
#: a curve has flattened when g is within this of 1
FLAT = 0.05
#: stage 1 does not run if thinned's median AUC is below this x the learner arm's in a cell
FLOOR = 0.8
BATCH = 64


def _num(v: str) -> Any:
    try:
        return float(v) if v != "" else math.nan
    except ValueError:
        return v


def read(data: Path) -> tuple[list[dict[str, Any]], dict[str, dict[str, np.ndarray]]]:
    """The rows (one per run) and each run's curve {t, return}."""
    with open(data / "runs.csv", newline="") as f:
        rows = [{k: _num(v) for k, v in r.items()} for r in csv.DictReader(f)]
    pts: dict[str, list[tuple[float, float]]] = {}
    with open(data / "curves.csv", newline="") as f:
        for r in csv.DictReader(f):
            pts.setdefault(r["run"], []).append((float(r["t"]), _num(r["return"])))
    curves = {}
    for run, p in pts.items():
        a = np.array(sorted(p), dtype=float)
        curves[run] = {"t": a[:, 0], "return": a[:, 1]}
    return rows, curves


def rho_of(row: dict[str, Any]) -> float:
    """The cell's requested replay ratio U x B / P, as the nearest of the map's."""
    rho = row["U_requested"] * BATCH / row["P_requested"]
    return min(MAP_T, key=lambda r: abs(math.log(r / rho)))


def flat_ratio(t: np.ndarray, ret: np.ndarray, big_t: float) -> float:
    """g at horizon ``big_t``: mean held return over [0.75 T, T] / over [0.5 T, 0.75 T)."""
    late = ret[(t >= 0.75 * big_t) & (t <= big_t + 1e-9)]
    mid = ret[(t >= 0.5 * big_t) & (t < 0.75 * big_t)]
    late, mid = late[np.isfinite(late)], mid[np.isfinite(mid)]
    if not late.size or not mid.size or not mid.mean() > 0:
        return math.nan
    return float(late.mean() / mid.mean())


def by_cell(rows: list[dict[str, Any]]) -> dict[str, dict[str, list[dict[str, Any]]]]:
    out: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for r in rows:
        out.setdefault(str(r["cell"]), {}).setdefault(str(r["replay_at"]), []).append(r)
    return out


def choose_t(rows: list[dict[str, Any]], curves: dict) -> dict[float, dict[str, Any]]:
    """Rule 1 per rho: {rho: {"T": chosen or None, "g": {(mult, cell, arm): median g}}}."""
    cells = by_cell(rows)
    out: dict[float, dict[str, Any]] = {}
    for rho in sorted({rho_of(r) for r in rows}):
        mine = {c: arms for c, arms in cells.items() if rho_of(next(iter(arms.values()))[0]) == rho}
        g: dict[tuple[float, str, str], float] = {}
        chosen = None
        for mult in CANDIDATES:
            big_t = MAP_T[rho] * mult
            ok = True
            for c, arms in mine.items():
                for arm in ARMS:
                    gs = [
                        flat_ratio(curves[r["run"]]["t"], curves[r["run"]]["return"], big_t)
                        for r in arms.get(arm, [])
                        if r["run"] in curves and r["T"] >= big_t - 1e-6
                    ]
                    gs = [x for x in gs if math.isfinite(x)]
                    med = float(np.median(gs)) if gs else math.nan
                    g[(mult, c, arm)] = med
                    ok &= math.isfinite(med) and abs(med - 1) <= FLAT
            if ok and chosen is None:
                chosen = big_t
        out[rho] = {"T": chosen, "g": g, "cells": sorted(mine)}
    return out


def _median(rs: list[dict[str, Any]], key: str) -> float:
    x = np.array([r.get(key, math.nan) for r in rs], dtype=float)
    x = x[np.isfinite(x)]
    return float(np.median(x)) if x.size else math.nan


def _median_ratio(rs: list[dict[str, Any]], num: str, den: str) -> float:
    x = np.array([r.get(num, math.nan) / r.get(den, math.nan) for r in rs], dtype=float)
    x = x[np.isfinite(x)]
    return float(np.median(x)) if x.size else math.nan


def stage1(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Rule 2: per cell thinned's median AUC / the learner arm's, and whether stage 1 runs."""
    ratios = {}
    for c, arms in by_cell(rows).items():
        t, e = (
            _median(arms.get("thinned", []), "auc_return"),
            _median(arms.get("learner", []), "auc_return"),
        )
        ratios[c] = t / e if e > 0 else math.nan
    known = [v for v in ratios.values() if math.isfinite(v)]
    complete = bool(ratios) and len(known) == len(ratios)
    runs = complete and all(v >= FLOOR for v in known)
    return {"ratios": ratios, "complete": complete, "runs": runs}


def _f(x: float, fmt: str = "{:.2f}") -> str:
    return fmt.format(x) if math.isfinite(x) else "-"


def planned() -> int:
    """The runs the pilot's spec plans (27)."""
    from mpirl.sweep import expand, load_spec

    return len(expand(load_spec(SPEC)))


def markdown(rows: list[dict[str, Any]], curves: dict, plan: int | None = None) -> str:
    """The generated section: both rules, then what each arm did; with fewer rows than the
    spec's runs (``plan``), the figures so far and no answer."""
    if not rows:
        return (
            "Not yet run: `python -m mpirl.sweep experiments/placement-3/pilot.toml`, then "
            "`python experiments/placement3_pilot.py --update docs/results.md`."
        )
    plan = planned() if plan is None else plan
    text = _rules(rows, curves)
    if len(rows) < plan:
        return (
            f"**Interim: {len(rows)} of the {plan} pilot runs.** Neither rule is applied before "
            "every run is in; the figures so far:\n\n"
            + "\n".join(
                line for line in text.splitlines() if not line.startswith(("- rho", "**Stage 1"))
            )
        )
    return text


def _rules(rows: list[dict[str, Any]], curves: dict) -> str:
    cells = by_cell(rows)
    loads = [r.get("load_max", math.nan) for r in rows]
    loads = [x for x in loads if isinstance(x, float) and math.isfinite(x)]
    lines = [
        f"{len(rows)} runs in {len(cells)} cells (load average during the runs: max "
        f"{_f(max(loads), '{:.1f}') if loads else '-'}).",
        "",
        "**Rule 1, T per rho** (median run's g = mean return over [0.75 T', T'] / over "
        f"[0.5 T', 0.75 T'); flattened within {FLAT:.0%} of 1 in every cell and arm):",
        "",
        "| rho | T' (x map's T) | "
        + " | ".join(f"{c}: {a}" for c in sorted(cells) for a in ARMS)
        + " |",
    ]
    ts = choose_t(rows, curves)
    ncol = len(cells) * len(ARMS)
    lines.append("|---|---|" + "---|" * ncol)
    for rho, res in ts.items():
        for mult in CANDIDATES:
            vals = [
                _f(res["g"].get((mult, c, a), math.nan), "{:.3f}") if c in res["cells"] else ""
                for c in sorted(cells)
                for a in ARMS
            ]
            lines.append(
                f"| {rho:g} | {MAP_T[rho] * mult:.0f} s ({mult:g}x) | " + " | ".join(vals) + " |"
            )
    lines.append("")
    for rho, res in ts.items():
        if res["T"] is not None:
            lines.append(
                f"- rho {rho:g}: **T = {res['T']:.0f} s** (the first candidate that flattened)."
            )
        else:
            lines.append(
                f"- rho {rho:g}: **not flattened at 1.5x the map's T**; stage 1 runs at "
                f"{MAP_T[rho] * CANDIDATES[-1]:.0f} s and says its curves may still rise."
            )
    s1 = stage1(rows)
    lines += [
        "",
        f"**Rule 2, whether stage 1 runs** (thinned's median return AUC / the learner arm's, "
        f"at least {FLOOR} in every cell):",
        "",
        "| cell | thinned / learner | "
        + " | ".join(
            f"{a}: AUC, link MB, delivered, updates/s, trained / uniform \\|td\\|, "
            "weighted / unweighted loss"
            for a in ARMS
        )
        + " |",
        "|---|---|" + "---|" * len(ARMS),
    ]
    for c in sorted(cells):
        arms = cells[c]
        parts = []
        for a in ARMS:
            rs = arms.get(a, [])
            ratio = _median_ratio(rs, "batch_td", "uniform_td")
            parts.append(
                f"{_f(_median(rs, 'auc_return'), '{:.0f}')}, "
                f"{_f(_median(rs, 'link_mb'), '{:.3g}')}, "
                f"{_f(_median(rs, 'delivered_fraction'))}, {_f(_median(rs, 'U'), '{:.0f}')}, "
                f"{_f(ratio)}, "
                f"{_f(_median_ratio(rs, 'train_loss', 'train_loss_unweighted'), '{:.2g}')}"
            )
        lines.append(f"| {c} | {_f(s1['ratios'][c])} | " + " | ".join(parts) + " |")
    lines.append("")
    if not s1["complete"]:
        lines.append("Rule 2 waits for every cell's thinned and learner runs.")
    elif s1["runs"]:
        lines.append(
            f"**Stage 1 runs**: thinned's median AUC is at least {FLOOR}x the learner arm's "
            "in every pilot cell."
        )
    else:
        low = ", ".join(c for c, v in s1["ratios"].items() if v < FLOOR)
        lines.append(
            f"**Stage 1 does not run**: thinned's median AUC is below {FLOOR}x the learner "
            f"arm's in {low}; docs/results.md reports the design's miss and why."
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=DATA, help="the pilot's exported rows")
    ap.add_argument("--update", default=None, help="rewrite this page's generated section")
    ap.add_argument("--check", default=None, help="exit 1 if this page's section differs")
    a = ap.parse_args(argv)
    rows, curves = read(a.data) if (a.data / "runs.csv").exists() else ([], {})
    text = markdown(rows, curves)
    print(text)
    from analysis.verdict import update_or_check

    for page, write in ((a.update, True), (a.check, False)):
        update_or_check(page, "placement3_pilot", text, str(a.data), write)


if __name__ == "__main__":
    main()
