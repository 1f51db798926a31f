"""Per-run rows and learning curves of the equal-wall-time design, as small CSVs to commit.

    python -m analysis.export RUNS_ROOT --into docs/results/data/NAME

reads every run folder under ``RUNS_ROOT`` (HDF5, `analysis.runs`) and merges one row per run
into ``NAME/runs.csv`` and its curves into ``NAME/curves.csv`` (a run already there is
replaced, others are kept, so a matrix run over several sittings, or on several machines,
accumulates). ``analysis.verdict`` builds docs/results.md from these files alone. The sweep
calls this after every finished run when its spec has ``export = "DIR"``.

Definitions (docs/results.md, "Plan for the equal-wall-time experiment"), on the learner's loop
clock, with T the run's ``--max-seconds`` (its wall time if it stopped earlier):

- window W = [T/2, T]: ``train_loss`` (importance-weighted ``/updates/loss``),
  ``train_loss_unweighted`` (``/updates/loss_unweighted``, the primary loss of docs/results.md),
  ``prio_td_held`` (``/transfers/priority_td_mean`` weighted by ``n``: PER's |td|+eps as held by
  the sender), ``prio_held`` (the same after the exponent,
  p^alpha), ``arrival_td`` (weighted by ``arrival_n``), ``ref_loss`` (mean over W's evaluations)
  and ``ref_loss_norm`` (the same of reference loss / mean Q^2 on the set: the Q scale out);
- the return curve R(t): the latest finished greedy evaluation's mean return (the first one's
  before it); ``auc_return`` = its mean over [0, T]; ``final_return`` = the mean of the
  evaluations in [0.75 T, T]; ``evals``: evaluations in [0, T];
- ``time_to_target_s``: the first evaluation at or above the target, if by T (``reached``);
  otherwise T (censored);
- ``link_mb``: learner-side link MB, both directions, over [0, T]; ``return_per_mb`` =
  ``auc_return`` / ``link_mb``;
- achieved rates: medians of ``/progress`` ``env_steps_per_s`` and ``updates_per_s`` over the
  rows in [0.1 T, T]; ``delivered_fraction`` (NaN for the buffer placement): the buffers'
  forwarded transitions over their env steps across [0.1 T, T], both from their ``/site`` rows
  (counted at the buffer, so no report lag: see ``_per_step``); ``rho``: the difference of the
  running total ``/progress/sampled`` across the window's rows over that of the env steps the
  buffers' ``/site`` rows count at the same times (the learner's ``env_steps`` without
  buffer files; the median of the rows' ``rho`` and ``delivered_fraction`` in runs logged
  before the totals were); requested: ``P_requested`` =
  ``--actor-steps-per-s`` x actor ranks, ``U_requested`` = ``--learner-updates-per-s`` (NaN:
  unpaced);
- ``load_mean`` / ``load_max``: the sweep's load-average samples during the run (``sweep.json``).
- what the learner trains on, over [0, T] and by quarter of it (Q_k = ((k-1) T/4, k T/4], the
  first from 0): ``batch_td`` and ``batch_td_q1`` .. ``batch_td_q4``, the mean ``/updates/
  td_abs_mean`` (|td| of each trained batch under the network that trained on it) in every
  placement; ``null_td`` and ``null_td_q1`` .. ``null_td_q4``, the within-placement null: the
  |td| on arrival (under the learner's network) of what reached the learner's memory, the
  ``arrival_td_mean`` of the /transfers rows of kind FORWARD weighted by ``arrival_n`` (NaN in a
  placement that forwards nothing to the learner: the buffer logs no statistic of what it
  stores); ``uniform_td`` and ``uniform_td_q1`` .. ``uniform_td_q4``, the mean ``/updates/
  td_abs_uniform``: each trained batch's |td| weighted by 1 / what it was drawn in proportion
  to, an estimate of what a uniform draw from the same memory would have met, the same figure
  in every placement (NaN in runs logged before it existed). batch / null and batch / uniform
  are what prioritized sampling adds within a placement.
- replay_at=thinned (NaN otherwise): ``thin_kept``, the fraction of received transitions the
  thinning draw kept over [0.1 T, T] (the buffers' /site ``thinned`` and ``inserted``), and
  ``thin_budget``, the median /site ``thin_budget`` there (the expected fraction the rule aimed
  at).

Curves: ``GRID`` + 1 points t_k = k T / GRID: ``return`` R(t_k), ``link_mb`` at t_k, and the
means of ``/updates/loss`` and of the held |td|+eps over (t_(k-1), t_k].
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from analysis.cells import cell_label, cell_of
from analysis.metrics import Kind, link_mb_at, resolve_target
from analysis.runs import Run, find_runs, load_run
from analysis.tables import field

GRID = 48
QUARTERS = (1, 2, 3, 4)
RUN_FIELDS = (
    "run",
    "cell",
    "replay_at",
    "seed",
    "T",
    "wall_s",
    "env_steps",
    "updates",
    "evals",
    "P_requested",
    "U_requested",
    "P",
    "U",
    "rho",
    "delivered_fraction",
    "train_loss",
    "train_loss_unweighted",
    "prio_td_held",
    "prio_held",
    "arrival_td",
    "ref_loss",
    "ref_loss_norm",
    "auc_return",
    "final_return",
    "target",
    "reached",
    "time_to_target_s",
    "link_mb",
    "return_per_mb",
    "load_mean",
    "load_max",
    "batch_td",
    *(f"batch_td_q{k}" for k in QUARTERS),
    "null_td",
    *(f"null_td_q{k}" for k in QUARTERS),
    "uniform_td",
    *(f"uniform_td_q{k}" for k in QUARTERS),
    "thin_kept",
    "thin_budget",
)
CURVE_FIELDS = ("run", "t", "return", "link_mb", "train_loss", "prio_td_held")


def _col(stream: dict, key: str) -> np.ndarray:
    n = len(stream.get("t", ()))
    return np.asarray(stream.get(key, np.full(n, np.nan)), "f8")


def _mean(x: np.ndarray, w: np.ndarray | None = None) -> float:
    ok = np.isfinite(x) if w is None else np.isfinite(x) & np.isfinite(w) & (w > 0)
    if not ok.any():
        return math.nan
    return float(np.mean(x[ok]) if w is None else np.sum(x[ok] * w[ok]) / np.sum(w[ok]))


def held_return(t_eval: np.ndarray, ret: np.ndarray, t: np.ndarray) -> np.ndarray:
    """R(t): the latest evaluation finished by t; the first one's value before it."""
    if not len(t_eval):
        return np.full(np.shape(t), np.nan)
    i = np.searchsorted(t_eval, t, side="right") - 1
    return ret[np.clip(i, 0, len(ret) - 1)]


def auc(t_eval: np.ndarray, ret: np.ndarray, horizon: float) -> float:
    """Mean of the step function R over [0, horizon] (exact)."""
    if not len(t_eval) or horizon <= 0:
        return math.nan
    inside = t_eval < horizon
    edges = np.concatenate([[0.0], t_eval[inside], [horizon]])
    values = held_return(t_eval, ret, edges[:-1])
    return float(np.sum(values * np.diff(edges)) / horizon)


def horizon(run: Run) -> float:
    t = float(run.config.get("max_seconds") or 0.0)
    wall = float(run.summary.get("wall_s") or 0.0)
    return min(t, wall) if t and wall else (t or wall)


def _achieved(run: Run, big_t: float) -> dict[str, float]:
    prog = run.learner.stream("progress")
    tp = _col(prog, "t")
    ok = (tp >= 0.1 * big_t) & (tp <= big_t + 1e-9)
    keys = {
        "P": "env_steps_per_s",
        "U": "updates_per_s",
        "rho": "rho",
        "delivered_fraction": "delivered_fraction",
    }
    out = {}
    for name, key in keys.items():
        x = _col(prog, key)[ok]
        out[name] = float(np.nanmedian(x)) if np.isfinite(x).any() else math.nan
    # the totals' ratios (logged since 2026-12-05): see _per_step
    produced = _produced(run)
    for name, total, per_row in (
        ("delivered_fraction", "delivered", "delivered_fraction"),
        ("rho", "sampled", "rho"),
    ):
        if total in prog:
            frac = _per_step(prog, ok, total, per_row, produced, _resumed(run))
            if frac is not None:
                out[name] = frac
    forwarded = _produced(run, "forwarded")
    if produced is not None and forwarded is not None and run.replay_at != "buffer":
        a, b = 0.1 * big_t, big_t
        span = produced(b) - produced(a)
        out["delivered_fraction"] = (forwarded(b) - forwarded(a)) / span if span > 0 else math.nan
    return out


def thinning(run: Run, big_t: float) -> dict[str, float]:
    """replay_at=thinned (NaN otherwise): ``thin_kept``, the fraction of the transitions the
    buffers received that the thinning draw kept over [0.1 T, T] (their mean f; drop-oldest
    losses come after it and count in ``delivered_fraction`` only), and ``thin_budget``, the
    median over the buffers' /site rows in that window of the expected fraction the rule
    aimed at, min(1, rho-budget, link-budget)."""
    out = {"thin_kept": math.nan, "thin_budget": math.nan}
    thinned, received = _produced(run, "thinned"), _produced(run, "inserted")
    if run.replay_at != "thinned" or thinned is None or received is None:
        return out
    a, b = 0.1 * big_t, big_t
    span = received(b) - received(a)
    if span > 0:
        out["thin_kept"] = 1.0 - (thinned(b) - thinned(a)) / span
    budgets = [
        np.asarray(s["thin_budget"], "f8")[(s["t"] >= a) & (s["t"] <= b)]
        for s in (d.stream("site") for d in run.buffers.values())
        if "thin_budget" in s and len(s.get("t", ()))
    ]
    x = np.concatenate(budgets) if budgets else np.zeros(0)
    if np.isfinite(x).any():
        out["thin_budget"] = float(np.nanmedian(x))
    return out


def _resumed(run: Run) -> bool:
    return "resumed_unix" in run.learner.attrs


def _produced(run: Run, column: str = "env_steps") -> Callable[[float], float] | None:
    """A buffers' running total at time t (the learner's clock): their /site rows' ``column``
    summed, each linear between its rows (its first and last value outside them); None when no
    buffer logged it.  Both the env steps and the forwarded transitions are counted where they
    happen, at the buffer, so their ratio over a window has no report lag in it."""
    rows = []
    for b in run.buffers.values():
        site = b.stream("site")
        if len(site.get("t", ())) and column in site:
            rows.append((np.asarray(site["t"], "f8"), np.asarray(site[column], "f8")))
    if not rows:
        return None
    return lambda t: float(sum(np.interp(t, ts, xs) for ts, xs in rows))


def _per_step(
    prog: dict,
    ok: np.ndarray,
    total: str,
    per_row: str,
    produced: Callable[[float], float] | None = None,
    resumed: bool = True,
) -> float | None:
    """A running total (``delivered``: transitions that reached the learner's memory;
    ``sampled``: transitions trained on) per env step over the window's rows: from the last row
    before the window (the loop's start, at 0, in a run never resumed; else the first row's own
    interval taken back out of its totals by its ``per_row``) to the window's last.  The env
    steps at those times are the buffers' own counts (``produced``, their /site rows) where
    there are any: the learner's ``env_steps`` arrive in the buffers' step reports (every
    0.25 s, and after the link), while transitions count as they land or train, so a short
    window holds transitions whose steps are not reported yet (a thinned run of 2 s read a
    delivered fraction of 1.11 in CI).  The rows' own ratio (``per_row``) is not used: a row
    whose report came late holds a burst of transitions over a few steps (15 was seen).  None
    (the rows' median stands) when the window starts in rows written before the totals were
    (-1: a run resumed under a version that logs them)."""
    d, steps, tp = _col(prog, total), _col(prog, "env_steps"), _col(prog, "t")
    rows = np.flatnonzero(ok)
    if not len(rows) or d[rows[-1]] < 0:
        return math.nan
    end, k = rows[-1], rows[0]
    if k > 0:
        d0, s0, t0 = d[k - 1], steps[k - 1], tp[k - 1]
    elif not resumed and d[0] >= 0:  # (-1: rows from before the totals, so resumed)
        d0, s0, t0 = 0.0, 0.0, 0.0
    else:  # the totals when the first row's interval began
        ds = (_col(prog, "env_steps_per_s") * _col(prog, "interval_s"))[0]
        frac = _col(prog, per_row)[0]
        t0 = tp[0] - _col(prog, "interval_s")[0]
        d0, s0 = (
            (d[0] - frac * ds, steps[0] - ds) if ds > 0 and np.isfinite(frac) else (d[0], steps[0])
        )
    if d0 < 0:
        return None
    span = produced(tp[end]) - produced(t0) if produced is not None else steps[end] - s0
    return float((d[end] - d0) / span) if span > 0 else math.nan


def requested(run: Run) -> dict[str, float]:
    """The rates the run asked for (NaN where it left them unpaced)."""
    actors = sum(1 for x in run.layout if x.get("role") == "actor")
    p = float(run.config.get("actor_steps_per_s") or 0.0) * actors
    u = float(run.config.get("learner_updates_per_s") or 0.0)
    return {"P_requested": p or math.nan, "U_requested": u or math.nan}


def _load(run: Run) -> dict[str, float]:
    try:
        s = json.loads((run.path / "sweep.json").read_text()).get("loadavg_1min", {})
        return {"load_mean": float(s["mean"]), "load_max": float(s["max"])}
    except (OSError, ValueError, KeyError, TypeError):
        return {"load_mean": math.nan, "load_max": math.nan}


def _eval_metrics(run: Run, big_t: float) -> dict[str, Any]:
    ev = run.learner.stream("evals")
    te, ret = _col(ev, "t"), _col(ev, "ret_mean")
    order = np.argsort(te, kind="stable")
    te, ret = te[order], ret[order]
    by_t = te <= big_t
    tgt, _ = resolve_target(run, None)
    hit = np.flatnonzero(by_t & (ret >= tgt)) if tgt is not None else np.zeros(0, int)
    in_w = by_t & (te >= big_t / 2)
    return {
        "evals": int(by_t.sum()),
        "auc_return": auc(te[by_t], ret[by_t], big_t),
        "final_return": _mean(ret[by_t & (te >= 0.75 * big_t)]),
        "ref_loss": _mean(_col(ev, "reference_loss")[order][in_w]),
        "ref_loss_norm": _mean(
            (_col(ev, "reference_loss") / _col(ev, "reference_q_sq_mean"))[order][in_w]
        ),
        "target": tgt if tgt is not None else math.nan,
        "reached": bool(len(hit)),
        "time_to_target_s": float(te[hit[0]]) if len(hit) else big_t,
    }


def trained_on(run: Run, big_t: float) -> dict[str, float]:
    """``batch_td``, ``null_td`` and ``uniform_td``, over [0, T] and by quarter of it (module
    docstring)."""
    upd, xf = run.learner.stream("updates"), run.learner.stream("transfers")
    tu, td = _col(upd, "t"), _col(upd, "td_abs_mean")
    uni = _col(upd, "td_abs_uniform") if "td_abs_uniform" in upd else np.full(tu.size, np.nan)
    tx, kind = _col(xf, "t"), _col(xf, "kind")
    fwd = kind == int(Kind.FORWARD)
    arr, an = _col(xf, "arrival_td_mean"), _col(xf, "arrival_n") if "arrival_n" in xf else None
    an = _col(xf, "n") if an is None else an
    edges = np.linspace(0.0, big_t, len(QUARTERS) + 1)
    out = {
        "batch_td": _mean(td[(tu >= 0) & (tu <= big_t)]),
        "null_td": _mean(arr[fwd & (tx >= 0) & (tx <= big_t)], an[fwd & (tx >= 0) & (tx <= big_t)]),
        "uniform_td": _mean(uni[(tu >= 0) & (tu <= big_t)]),
    }
    for k in QUARTERS:
        lo, hi = edges[k - 1], edges[k]
        iu = ((tu > lo) | ((k == 1) & (tu >= lo))) & (tu <= hi)
        ix = fwd & ((tx > lo) | ((k == 1) & (tx >= lo))) & (tx <= hi)
        out[f"batch_td_q{k}"] = _mean(td[iu])
        out[f"null_td_q{k}"] = _mean(arr[ix], an[ix])
        out[f"uniform_td_q{k}"] = _mean(uni[iu])
    return out


def run_id(run: Run) -> str:
    """The run's folder relative to the current folder when it is under it (as the sweep's
    ``out`` names it), else as given: the key that merges rows across sittings."""
    try:
        return str(run.path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(run.path)


def run_row(run: Run, root: Path) -> dict[str, Any]:
    """One row of runs.csv (module docstring)."""
    big_t = horizon(run)
    upd, xf = run.learner.stream("updates"), run.learner.stream("transfers")
    tu, tx = _col(upd, "t"), _col(xf, "t")
    wu = (tu >= big_t / 2) & (tu <= big_t)
    wx = (tx >= big_t / 2) & (tx <= big_t)
    n = _col(xf, "n")
    an = _col(xf, "arrival_n") if "arrival_n" in xf else n
    cell = cell_of(run, root)
    row = {
        "run": run_id(run),
        "cell": cell_label(cell) if cell else "all runs",
        "replay_at": run.replay_at,
        "seed": run.seed,
        "T": big_t,
        "wall_s": run.summary.get("wall_s"),
        "env_steps": run.summary.get("env_steps"),
        "updates": run.summary.get("updates"),
        **requested(run),
        **_achieved(run, big_t),
        "train_loss": _mean(_col(upd, "loss")[wu]),
        "train_loss_unweighted": _mean(_col(upd, "loss_unweighted")[wu]),
        "prio_td_held": _mean(_col(xf, "priority_td_mean")[wx], n[wx]),
        "prio_held": _mean(_col(xf, "priority_mean")[wx], n[wx]),
        "arrival_td": _mean(_col(xf, "arrival_td_mean")[wx], an[wx]),
        **_eval_metrics(run, big_t),
        "link_mb": float(link_mb_at(run, np.array([big_t]))[0]),
        **_load(run),
        **trained_on(run, big_t),
        **thinning(run, big_t),
    }
    row["return_per_mb"] = (
        row["auc_return"] / row["link_mb"]
        if row["link_mb"] and math.isfinite(row["link_mb"])
        else math.nan
    )
    if run.replay_at == "buffer":  # no forwarding (thinned: what arrived / produced)
        row["delivered_fraction"] = math.nan
    return row


def _binned(t: np.ndarray, x: np.ndarray, edges: np.ndarray, w: np.ndarray | None = None):
    out = np.full(len(edges), np.nan)
    k = np.searchsorted(edges, t, side="left")  # (t_(k-1), t_k] -> k
    for j in range(1, len(edges)):
        sel = k == j
        if sel.any():
            out[j] = _mean(x[sel], None if w is None else w[sel])
    return out


def run_curves(run: Run) -> list[dict[str, Any]]:
    big_t = horizon(run)
    grid = np.linspace(0.0, big_t, GRID + 1)
    ev, upd, xf = (run.learner.stream(s) for s in ("evals", "updates", "transfers"))
    te, ret = _col(ev, "t"), _col(ev, "ret_mean")
    order = np.argsort(te, kind="stable")
    cols = {
        "return": held_return(te[order], ret[order], grid),
        "link_mb": link_mb_at(run, grid),
        "train_loss": _binned(_col(upd, "t"), _col(upd, "loss"), grid),
        "prio_td_held": _binned(_col(xf, "t"), _col(xf, "priority_td_mean"), grid, _col(xf, "n")),
    }
    return [
        {"run": run_id(run), "t": float(grid[k]), **{c: float(v[k]) for c, v in cols.items()}}
        for k in range(len(grid))
    ]


def merge_csv(path: Path, fields: tuple[str, ...], rows: list[dict], replace: set[str]) -> None:
    """Write ``rows`` into ``path``, keeping its rows of runs not in ``replace``."""
    kept = []
    if path.exists():
        with path.open(newline="") as f:
            kept = [r for r in csv.DictReader(f) if r["run"] not in replace]
    new = [{k: field(r.get(k)) for k in fields} for r in rows]
    allrows = sorted(kept + new, key=lambda r: (r["run"], float(r.get("t") or 0)))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with tmp.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields, lineterminator="\n")
        w.writeheader()
        w.writerows(allrows)
    tmp.replace(path)


def export(root: Path, into: Path, only: list[Path] | None = None) -> int:
    """Merge the runs under ``root`` (or only the folders ``only``, their cells still named
    from their path below ``root``) into ``into``; a lock file keeps concurrent sweeps' tasks
    (a SLURM array) from overwriting each other's rows."""
    import fcntl

    runs = [load_run(p) for p in (only if only is not None else find_runs(root))]
    rows = [run_row(r, root) for r in runs]
    curves = [c for r in runs for c in run_curves(r)]
    ids = {row["run"] for row in rows}
    into.mkdir(parents=True, exist_ok=True)
    with open(into / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        merge_csv(into / "runs.csv", RUN_FIELDS, rows, ids)
        merge_csv(into / "curves.csv", CURVE_FIELDS, curves, ids)
    return len(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m analysis.export",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("root", type=Path, help="a run folder or a folder of run folders")
    ap.add_argument("--into", type=Path, required=True, help="folder of runs.csv and curves.csv")
    ap.add_argument(
        "--run",
        type=Path,
        action="append",
        help="export only this run folder under ROOT (repeatable)",
    )
    a = ap.parse_args(argv)
    for p in [a.root, *(a.run or [])]:
        if not (p.exists() and (p is a.root or (p / "learner.h5").exists())):
            print(f"analysis.export: {p} is not a run folder or a folder of runs", file=sys.stderr)
            return 2
    n = export(a.root, a.into, a.run)
    print(f"analysis.export: {n} runs into {a.into}/runs.csv and curves.csv")
    return 0 if n else 1


if __name__ == "__main__":
    sys.exit(main())
