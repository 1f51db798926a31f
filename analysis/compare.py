"""Compare the two replay placements over an experiment: tables, plots and ``report.md``.

    python -m analysis.compare EXPERIMENT_DIR [--out DIR] [--target R] [--window W] [--tol TOL]

EXPERIMENT_DIR holds run folders at any depth (a run folder contains ``learner.h5``). Runs are
grouped by **link profile** (config ``env``, ``link`` and the overrides ``latency_ms``,
``bandwidth_mbps``, ``jitter_ms``, ``link_change`` when set) and, within a profile, by
**placement** (``replay_at``: ``learner`` = existing, Ape-X style; ``buffer`` = proposed); the runs
of a group are its seeds. A config key (other than seeds, budgets and output settings) that
differs between runs of one placement splits it into variants (``inflight=1``, ...).

Output in ``--out`` (default EXPERIMENT_DIR/analysis): ``report.md`` (every table, links to the
plots, one row per run), ``<profile>.md`` (the profile's table), ``<profile>-{loss,priority,
return,link}.png``, ``runs.csv`` (every per-run metric). Metric definitions: `analysis.metrics`
and docs/hdf5.md. Works on runs still being written and on killed runs (`analysis.runs`).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import re
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from analysis import metrics as M
from analysis.runs import Run, find_runs, load_run

__all__ = ["Cell", "Group", "Profile", "analyse_cell", "compare", "crossover_map",
           "group_cells", "group_runs", "load_experiment", "paper_report", "profile_table",
           "ratio"]

PROFILE_KEYS = ("env", "link", "latency_ms", "bandwidth_mbps", "jitter_ms", "link_change")
# Keys that never split runs into groups: seeds, budgets, output and logging settings.
NOT_A_VARIANT = {"seed", "run_dir", "config", "max_env_steps", "max_seconds", "max_updates",
                 "target_return",
                 "progress_seconds", "flush_seconds", "torch_threads", "replay_at",
                 *PROFILE_KEYS}
PLACEMENT = {"learner": "existing", "buffer": "proposed"}
PAPER = {"loss_conv": 0.26, "prio_held_conv": 3.92, "prio_arrival_conv": 3.92}


@dataclass
class Group:
    """The seeds of one placement (variant) under one link profile."""

    label: str  # e.g. "existing (replay_at=learner)"
    replay_at: str
    runs: list[Run]
    metrics: list[dict[str, Any]] = field(default_factory=list)

    def values(self, key: str) -> np.ndarray:
        out = []
        for m in self.metrics:
            v = m.get(key)
            out.append(float(v) if v is not None else np.nan)
        return np.array(out, "f8")

    def mean(self, key: str) -> float:
        v = self.values(key)
        v = v[np.isfinite(v)]
        return float(np.mean(v)) if len(v) else float("nan")


@dataclass
class Profile:
    label: str
    slug: str
    groups: list[Group]
    warnings: list[str] = field(default_factory=list)
    table: str = ""
    plots: dict[str, Path] = field(default_factory=dict)


def load_experiment(exp_dir: str | Path) -> tuple[list[Run], list[str]]:
    """Every run folder under ``exp_dir``, read; plus one line per folder that could not be."""
    runs, errors = [], []
    for p in find_runs(exp_dir):
        try:
            runs.append(load_run(p))
        except Exception as e:  # noqa: BLE001 - one unreadable run must not stop the report
            errors.append(f"{p}: {type(e).__name__}: {e}")
    return runs, errors


def _fmt_key(v: Any) -> str:
    return json.dumps(v) if isinstance(v, (list, dict)) else str(v)


def profile_of(run: Run) -> tuple[str, ...]:
    c = run.config
    return tuple(_fmt_key(c.get(k)) for k in PROFILE_KEYS)


def profile_label(key: tuple[str, ...]) -> str:
    d = dict(zip(PROFILE_KEYS, key))
    parts = [d["env"], f"link {d['link']}"]
    parts += [f"{k}={d[k]}" for k in PROFILE_KEYS[2:] if d[k] != "None"]
    return ", ".join(parts)


def slugify(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9.]+", "-", s).strip("-").lower() or "profile"


def group_runs(runs: list[Run]) -> list[Profile]:
    """Runs -> profiles -> placement groups (existing first), seeds within a group."""
    by_profile: dict[tuple, list[Run]] = {}
    for r in runs:
        by_profile.setdefault(profile_of(r), []).append(r)
    profiles, slugs = [], set()
    for key in sorted(by_profile):
        label = profile_label(key)
        slug = slugify(label)
        while slug in slugs:
            slug += "-x"
        slugs.add(slug)
        groups, warnings = [], []
        placements: dict[str, list[Run]] = {}
        for r in by_profile[key]:
            placements.setdefault(r.replay_at, []).append(r)
        order = sorted(placements, key=lambda p: ({"learner": 0, "buffer": 1}.get(p, 2), p))
        fixed: dict[str, dict[str, str]] = {}
        for place in order:
            rs = placements[place]
            keys = sorted({k for r in rs for k in r.config} - NOT_A_VARIANT)
            varying = [k for k in keys if len({_fmt_key(r.config.get(k)) for r in rs}) > 1]
            fixed[place] = {k: _fmt_key(rs[0].config.get(k)) for k in keys if k not in varying}
            variants: dict[tuple, list[Run]] = {}
            for r in rs:
                variants.setdefault(tuple(_fmt_key(r.config.get(k)) for k in varying),
                                    []).append(r)
            for vkey in sorted(variants):
                name = f"{PLACEMENT.get(place, place)} (replay_at={place}"
                name += "".join(f", {k}={v}" for k, v in zip(varying, vkey)) + ")"
                vruns = sorted(variants[vkey], key=lambda r: (str(r.seed), str(r.path)))
                groups.append(Group(name, place, vruns))
        if len(fixed) > 1:  # the placements should differ only in replay_at
            a, b = (fixed[p] for p in order[:2])
            ignore = {"inflight", "max_staleness", "forward_chunk", "forward_credits",
                      "forward_overflow"}  # settings of one placement only
            diff = [k for k in sorted(a.keys() & b.keys()) if a[k] != b[k] and k not in ignore]
            if diff:
                warnings.append("the placements also differ in " + ", ".join(
                    f"{k} ({order[0]}: {a[k]}, {order[1]}: {b[k]})" for k in diff))
        for g in groups:
            seeds = [r.seed for r in g.runs]
            if len(set(map(str, seeds))) < len(seeds):
                warnings.append(f"{g.label}: repeated seeds {seeds}")
            unfinished = [r.path.name for r in g.runs if not r.finished]
            if unfinished:
                warnings.append(f"{g.label}: unfinished (live or killed) runs, summary derived "
                                f"from the streams: {', '.join(unfinished)}")
        profiles.append(Profile(label, slug, groups, warnings))
    return profiles


# --- the table ---------------------------------------------------------------------------------

def _num(v: float, digits: int = 3) -> str:
    if v is None or not np.isfinite(v):
        return "n/a"
    a = abs(v)
    if a >= 1000:
        return f"{v:,.0f}"
    if a == 0:
        return "0"
    dec = max(0, digits - 1 - math.floor(math.log10(a)))
    return f"{v:.{dec}f}"


def _bytes(v: float) -> str:
    if v is None or not np.isfinite(v):
        return "n/a"
    for unit, f in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(v) >= f:
            return f"{_num(v / f)} {unit}"
    return f"{_num(v)} B"


def _cell(g: Group, key: str, fmt=_num) -> str:
    v = g.values(key)
    ok = v[np.isfinite(v)]
    n = len(v)
    if not len(ok):
        return "n/a"
    if len(ok) == 1:
        return f"{fmt(ok[0])} (n={len(ok)}{'' if len(ok) == n else f'/{n}'})"
    return (f"{fmt(ok.mean())} ({fmt(ok.min())}–{fmt(ok.max())}, "
            f"n={len(ok)}{'' if len(ok) == n else f'/{n}'})")


def _target_cell(g: Group, key: str, fmt=_num) -> str:
    v = g.values(key)
    ok = v[np.isfinite(v)]
    n = len(v)
    if not len(ok):
        return f"not reached (0/{n})"
    core = fmt(ok.mean()) if len(ok) == 1 else f"{fmt(ok.mean())} ({fmt(ok.min())}–{fmt(ok.max())}"
    core += ")" if len(ok) > 1 else ""
    return f"{core}, {len(ok)}/{n} reached"


def _conv_cell(g: Group) -> str:
    parts = []
    for method in ("settled", "fallback", "none"):
        ms = [m for m in g.metrics if m["conv_method"] == method]
        if not ms:
            continue
        ups = sorted(m["conv_update"] for m in ms)
        where = f"from update {ups[0]:,}" if len(ups) == 1 else \
            f"from updates {ups[0]:,}–{ups[-1]:,}"
        name = {"settled": "settled", "fallback": "fallback: last 25%",
                "none": "no updates"}[method]
        parts.append(f"{name} ×{len(ms)}" + (f", {where}" if method != "none" else ""))
    return "; ".join(parts)


def ratio(num: Group, den: Group, key: str) -> float:
    """mean over ``num``'s seeds / mean over ``den``'s seeds (NaN when either is missing)."""
    a, b = num.mean(key), den.mean(key)
    return a / b if np.isfinite(a) and np.isfinite(b) and b != 0 else float("nan")


ROWS = [  # (metric key, row label, cell kind)
    ("updates", "learner updates", "num"),
    ("env_steps", "env steps", "num"),
    ("conv", "after-convergence window", "conv"),
    ("loss_conv", "training loss after convergence", "num"),
    ("prio_held_conv", "transferred priority after convergence: held by sender", "num"),
    ("prio_arrival_conv", "transferred priority after convergence: on arrival (learner's net)",
     "num"),
    ("td_arrival_conv", "transferred \\|td\\| after convergence: on arrival", "num"),
    ("link_bytes_per_update", "link bytes per learner update (both directions)", "bytes"),
    ("link_bytes_total", "link bytes in total (both directions)", "bytes"),
    ("link_bytes_in", "link bytes toward the learner", "bytes"),
    ("link_bytes_out", "link bytes toward the buffers", "bytes"),
    ("env_steps_to_target", "env steps to target return", "target"),
    ("time_to_target_s", "wall time to target return (s)", "target"),
    ("final_eval", "final greedy return (last eval)", "num"),
    ("best_eval", "best greedy return", "num"),
]
RATIO_ROWS = {"loss_conv", "prio_held_conv", "prio_arrival_conv", "td_arrival_conv",
              "link_bytes_per_update", "link_bytes_total", "link_bytes_in", "link_bytes_out",
              "env_steps_to_target", "time_to_target_s", "final_eval", "updates", "env_steps"}


def profile_table(p: Profile) -> str:
    """The markdown table of one profile: one column per placement (variant), then the ratios
    proposed / existing (means over seeds) and the paper's ratios."""
    existing = [g for g in p.groups if g.replay_at == "learner"]
    proposed = [g for g in p.groups if g.replay_at == "buffer"]
    pairs = [(g, existing[0]) for g in proposed] if existing else []
    targets = sorted({m["target"] for g in p.groups for m in g.metrics if m["target"] is not None})
    tgt = "/".join(f"{t:g}" for t in targets) if targets else "none"
    head = ["metric", *(g.label for g in p.groups)]
    multi = len(pairs) > 1
    head += [f"proposed / existing{f' ({pg.label})' if multi else ''}" for pg, _ in pairs]
    head.append("paper (proposed / existing)")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for key, label, kind in ROWS:
        if key in ("env_steps_to_target", "time_to_target_s"):
            label = f"{label}, R = {tgt}"
        cells = [label]
        for g in p.groups:
            if kind == "conv":
                cells.append(_conv_cell(g))
            elif kind == "target":
                cells.append(_target_cell(g, key))
            else:
                cells.append(_cell(g, key, _bytes if kind == "bytes" else _num))
        for pg, eg in pairs:
            if kind == "target" and not all(np.isfinite(g.values(key)).all() for g in (pg, eg)):
                cells.append("n/a")  # a mean over the seeds that reached it would flatter
            else:
                cells.append(_num(ratio(pg, eg, key)) if key in RATIO_ROWS else "")
        cells.append(_num(PAPER[key]) if key in PAPER else "")
        lines.append("| " + " | ".join(cells) + " |")
    seeds = "; ".join(f"{g.label}: seeds {', '.join(str(r.seed) for r in g.runs)}"
                      for g in p.groups)
    notes = [
        "",
        f"Cells: mean over seeds (min–max, n = seeds with a value). {seeds}.",
        ("After convergence: from the update where the loss's moving average settles within "
        "±tol of its final level (`settled`), else the last 25% of updates (`fallback`); "
        "see analysis/metrics.py. Transferred priorities are weighted by transitions per message."),
        ("Paper ratios: loss 0.26 and transferred priority 3.92 after convergence (the paper "
        "gives one priority figure; both definitions are shown beside it)."),
    ]
    if not existing or not proposed:
        notes.append("Only one placement in this profile: no ratios.")
    if len(existing) > 1:
        notes.append(f"Several existing variants: ratios use {existing[0].label}.")
    return "\n".join(lines + notes) + "\n"


# --- the report -------------------------------------------------------------------------------

def _runs_table(profiles: list[Profile], exp_dir: Path) -> str:
    head = ["run", "placement", "seed", "stop", "summary", "updates", "after conv.",
            "loss", "prio held", "prio arrival", "bytes/update", "final eval"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for p in profiles:
        for g in p.groups:
            for r, m in zip(g.runs, g.metrics):
                try:
                    name = str(r.path.relative_to(exp_dir)) or "."
                except ValueError:
                    name = str(r.path)
                lines.append("| " + " | ".join([
                    name, g.replay_at, str(r.seed), str(m["stop_reason"]), m["summary_source"],
                    f"{m['updates']:,}", f"{m['conv_method']} @ {m['conv_update']:,}",
                    _num(m["loss_conv"]), _num(m["prio_held_conv"]),
                    _num(m["prio_arrival_conv"]), _bytes(m["link_bytes_per_update"] or np.nan),
                    _num(m["final_eval"] if m["final_eval"] is not None else np.nan),
                ]) + " |")
    return "\n".join(lines) + "\n"


def compare(exp_dir: str | Path, out: str | Path | None = None, target: float | None = None,
            window: int | None = None, tol: float = M.TOL, plots: bool = True) -> list[Profile]:
    """Read every run under ``exp_dir``, write tables, plots, ``runs.csv`` and ``report.md``
    into ``out`` (default ``exp_dir/analysis``); returns the profiles (groups, metrics, tables).
    """
    exp_dir = Path(exp_dir)
    out = Path(out) if out is not None else exp_dir / "analysis"
    runs, errors = load_experiment(exp_dir)
    profiles = group_runs(runs)
    out.mkdir(parents=True, exist_ok=True)
    all_metrics = []
    for p in profiles:
        for g in p.groups:
            g.metrics = [M.run_metrics(r, target=target, window=window, tol=tol) for r in g.runs]
            all_metrics += [{"profile": p.label, "group": g.label, **m} for m in g.metrics]
        p.table = profile_table(p)
        (out / f"{p.slug}.md").write_text(f"# {p.label}\n\n" + p.table)
        if plots:
            conv_t = {g.label: float(np.nanmedian(g.values("conv_t"))) for g in p.groups
                      if np.isfinite(g.values("conv_t")).any()}
            p.plots = plot_groups(p, out, conv_t)
    if all_metrics:
        keys = list(dict.fromkeys(k for m in all_metrics for k in m))
        with open(out / "runs.csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=keys)
            w.writeheader()
            w.writerows(all_metrics)
    (out / "report.md").write_text(report_markdown(exp_dir, out, profiles, errors, window, tol))
    return profiles


def plot_groups(p: Profile, out: Path, conv_t: dict[str, float]) -> dict[str, Path]:
    from analysis.plots import plot_profile

    return plot_profile(p.label, {g.label: g.runs for g in p.groups}, out, p.slug, conv_t)


def report_markdown(exp_dir: Path, out: Path, profiles: list[Profile], errors: list[str],
                    window: int | None, tol: float) -> str:
    n_runs = sum(len(g.runs) for p in profiles for g in p.groups)
    w = f"W = {window}" if window else f"W = clip(updates // 10, 10, {M.MAX_WINDOW})"
    lines = [
        "# mpirl: existing vs proposed replay placement",
        "",
        (f"Experiment `{exp_dir}`: {n_runs} runs in {len(profiles)} link profile(s); "
        f"generated {time.strftime('%Y-%m-%d %H:%M:%S')}."),
        "",
        ("- **existing** = `replay_at=learner` (Ape-X style: every experience crosses the link); "
        "**proposed** = `replay_at=buffer` (only prioritized batches cross)."),
        (f"- **after convergence**: per run, from the first update `j*` after which the moving "
        f"average of the loss over {w} updates stays within ±{tol:.0%} of its final level (the "
        f"mean of the last W updates), if that window holds at least max(W, 10% of the "
        f"updates); otherwise the last 25% of the updates (`fallback`). Transfers count when "
        f"their `t` is at or after update `j*`'s."),
        ("- **transferred priority**: `held by sender` = `transfers/priority_mean` (the buffer's "
        "memory, or the actors' initial priority when forwarding), `on arrival` = "
        "`transfers/arrival_priority_mean` ((|td|+eps)^alpha under the learner's network); "
        "means weighted by `transfers/n`."),
        ("- **link bytes**: the learner's side of the link, both directions "
        "(`summary.json` `link_bytes_in` + `link_bytes_out`)."),
        ("- **to target**: `summary.json` `time_to_target_s` / `env_steps_to_target`, or the "
        "first greedy eval with mean return >= R."),
        "",
    ]
    if errors:
        lines += ["**Unreadable run folders:**", "", *[f"- {e}" for e in errors], ""]
    for p in profiles:
        lines += [f"## {p.label}", ""]
        lines += [f"> warning: {x}" for x in p.warnings]
        if p.warnings:
            lines.append("")
        lines += [p.table, ""]
        for name, path in p.plots.items():
            lines += [f"![{name}: {p.label}]({path.name})", ""]
    lines += ["## Runs", "", _runs_table(profiles, exp_dir), "",
              "Every per-run metric: `runs.csv`."]
    return "\n".join(lines) + "\n"


# --- the paper experiment: cells, ratios with intervals, the decision, the crossover map ------
#
# A *cell* is one combination of the sweep's axes other than the placement: the folder names
# ``OUT/<axis>=<v>,<axis>=<v>/seed<k>`` of mpirl.sweep (``replay_at=...`` dropped), or, for run
# folders without ``=`` in their names, the config keys that differ between runs (placement-only
# and output settings left out). Within a cell the two placements are paired by ``seed``.

PLACEMENT_ONLY = {"inflight", "max_staleness", "forward_chunk", "forward_credits",
                  "forward_overflow"}
# (metric key, label, in the forest plot): ratios proposed / existing, geometric means
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


def cell_of(run: Run, root: Path) -> tuple[tuple[str, str], ...] | None:
    """The cell from the sweep's folder names (None when no folder of the path has ``k=v``)."""
    try:
        parts = run.path.resolve().relative_to(root.resolve()).parts
    except ValueError:
        parts = run.path.parts
    pairs = []
    for part in parts:
        for item in part.split(","):
            k, eq, v = item.partition("=")
            if eq and k != "replay_at":
                pairs.append((k, v))
    return tuple(pairs) if any("=" in p for p in parts) else None


def group_cells(runs: list[Run], root: Path) -> dict[tuple, list[Run]]:
    """``{cell: runs}``; the cell is a tuple of (axis, value) pairs (see above)."""
    from_names = {id(r): cell_of(r, root) for r in runs}
    if any(v is None for v in from_names.values()):
        keys = sorted({k for r in runs for k in r.config} - NOT_A_VARIANT - PLACEMENT_ONLY
                      - {"reference_set"})
        varying = [k for k in keys if len({_fmt_key(r.config.get(k)) for r in runs}) > 1]
        from_names = {id(r): tuple((k, _fmt_key(r.config.get(k))) for k in varying)
                      for r in runs}
    cells: dict[tuple, list[Run]] = {}
    for r in runs:
        cells.setdefault(from_names[id(r)], []).append(r)
    return dict(sorted(cells.items(), key=lambda kv: [_sort_key(v) for _, v in kv[0]]))


def _sort_key(v: str):
    try:
        return (0, float(v), "")
    except ValueError:
        return (1, 0.0, v)


def cell_label(cell: tuple) -> str:
    return ", ".join(f"{k}={v}" for k, v in cell) or "all runs"


def _budget_s(runs: list[Run]) -> float:
    """The time budget that censors time to target: config max_seconds when every run has one,
    else the longest run's wall time."""
    ms = [float(r.config.get("max_seconds") or 0) for r in runs]
    if ms and all(m > 0 for m in ms):
        return max(ms)
    return max((float(r.summary.get("wall_s") or 0) for r in runs), default=1.0) or 1.0


@dataclass
class Cell:
    key: tuple
    label: str
    metrics: dict[str, list[dict[str, Any]]]  # placement -> per-run paper_metrics
    ratios: dict[str, Any] = field(default_factory=dict)  # metric -> stats.Ratio
    ttt: dict[str, Any] = field(default_factory=dict)  # placement -> stats.TimeToTarget
    budget_s: float = float("nan")
    decision: Any = None
    crossover: dict[str, str] = field(default_factory=dict)


def analyse_cell(key: tuple, runs: list[Run], target: float | None = None) -> Cell:
    """Per-seed metrics of both placements, every ratio with its paired interval, censored
    time to target, the decision rule and the crossover verdicts of one cell."""
    from analysis import stats as S

    by = {"learner": [], "buffer": []}
    for r in runs:
        by.setdefault(r.replay_at, []).append(M.paper_metrics(r, target=target))
    c = Cell(key, cell_label(key), by, budget_s=_budget_s(runs))
    p, e = by["buffer"], by["learner"]
    for k, label, _ in CELL_METRICS:
        c.ratios[k] = S.ratio_ci(S.seed_values(p, k), S.seed_values(e, k),
                                 label=f"{c.label}: {label}")
    # time (and updates) to target, a seed that did not reach it censored at its own run's end:
    # the most it could have taken as far as the run shows, so the censoring favours the
    # placement that failed and a win is conservative (max_seconds would not be: a run stopped
    # by its update budget long before it would count as having needed max_seconds)
    ends = {place: {m["seed"]: _run_end(m, "wall_s", c.budget_s) for m in ms}
            for place, ms in by.items()}
    for place, ms in by.items():
        c.ttt[place] = S.time_to_target([m["time_to_target_s"] for m in ms],
                                        max(ends[place].values(), default=c.budget_s))
    n_budget = max((_run_end(m, "updates", 0.0) for ms in by.values() for m in ms),
                   default=0.0) or float("nan")
    # no seed of either placement reached the target (MinAtar has none): every value would be a
    # run's length, so there is no ratio to give, not a ratio of run lengths
    reached = any(m["time_to_target_s"] is not None for ms in by.values() for m in ms)
    for key, unit, end, fallback in (("time_to_target_s", "time_to_target", "wall_s", c.budget_s),
                                     ("updates_to_target", "updates_to_target", "updates",
                                      n_budget)):
        censored = {place: {m["seed"]: (float(m[key]) if m[key] is not None
                                        else _run_end(m, end, fallback)) for m in ms}
                    if reached else {} for place, ms in by.items()}
        c.ratios[unit] = S.ratio_ci(censored["buffer"], censored["learner"],
                                    label=f"{c.label}: {unit.replace('_', ' ')} (censored)")
    c.decision = S.decide(c.ratios["ref_loss"], c.ratios["prio_held"])
    c.crossover = {"time to target": (_winner(c.ratios["time_to_target"], lower_is_better=True)
                                      if reached else "neither reached the target (no winner: "
                                      "every seed censored at its run's end)"),
                   "return per MB": _winner(c.ratios["return_per_mb"], lower_is_better=False)}
    return c


def _run_end(m: dict, key: str, fallback: float) -> float:
    """Where a run ended (``wall_s`` or ``updates`` of its summary); ``fallback`` for a run
    without one (it failed before writing its summary)."""
    v = m.get(key)
    return float(v) if v is not None and np.isfinite(float(v)) and float(v) > 0 else fallback


def _winner(r, lower_is_better: bool) -> str:
    """Which placement wins a cell on one ratio proposed / existing: the one its interval
    favours when the interval excludes 1, else "no clear winner"."""
    if r.below(1):
        w = "proposed" if lower_is_better else "existing"
    elif r.above(1):
        w = "existing" if lower_is_better else "proposed"
    else:
        return f"no clear winner ({r.text()})"
    return f"{w} ({r.text()})"


def _vals(ms: list[dict], key: str) -> str:
    return ", ".join(f"{m['seed']}: {_num(m[key]) if m[key] is not None else 'n/a'}"
                     for m in sorted(ms, key=lambda m: str(m["seed"])))


DECIDING = 0.9  # a cell is in the paper's regime when the existing placement delivers less


def deciding(c: Cell) -> bool:
    """The cell is in the paper's regime: the median delivered fraction of its existing runs
    is below `DECIDING` (docs/results/appendix/fixed-updates.md, Plan)."""
    v = [m["delivered_fraction"] for m in c.metrics["learner"]
         if np.isfinite(m["delivered_fraction"])]
    return bool(v) and float(np.median(v)) < DECIDING


def headline(cells: list[Cell]) -> str:
    """The verdict over the deciding cells: "reproduced" or "refuted in this regime" only when
    every deciding cell says so, else "holds only where ..." naming the cells that reproduce."""
    from analysis import stats as S

    dec = [c for c in cells if deciding(c)]
    if not dec:
        return (f"no cell is in the paper's regime (the existing placement delivered >= "
                f"{DECIDING:.0%} of production everywhere): no verdict")
    verdicts = {c.decision.verdict for c in dec}
    names = ", ".join(c.label for c in dec)
    if verdicts == {S.REPRODUCED}:
        return f"**reproduced** in every deciding cell ({names})"
    if verdicts == {S.REFUTED}:
        return f"**refuted in this regime** in every deciding cell ({names})"
    yes = [c.label for c in dec if c.decision.verdict == S.REPRODUCED]
    others = "; ".join(f"{c.label}: {c.decision.verdict}" for c in dec
                       if c.decision.verdict != S.REPRODUCED)
    if not yes:  # nothing reproduced and not everything refuted: no claim either way
        return f"**inconclusive**: no deciding cell reproduces it ({others})"
    return f"**holds only where** {'; '.join(yes)} (the other deciding cells: {others})"


def cell_table(c: Cell) -> str:
    """Markdown: every metric's per-seed values in each placement and the ratio with its CI."""
    lines = ["| metric | existing (seed: value) | proposed (seed: value) | "
             "proposed / existing [95% CI] | CI method |", "|---|---|---|---|---|"]
    for k, label, _ in CELL_METRICS:
        r = c.ratios[k]
        lines.append(f"| {label} | {_vals(c.metrics['learner'], k)} | "
                     f"{_vals(c.metrics['buffer'], k)} | {r.text()} | {r.method} |")
    r = c.ratios["time_to_target"]
    t = {p: c.ttt[p] for p in ("learner", "buffer")}
    lines.append(
        "| time to target (s; a seed that did not reach it: censored at its run's end) | "
        f"{_vals(c.metrics['learner'], 'time_to_target_s')}; reached "
        f"{t['learner'].reached}/{t['learner'].n}, median {t['learner'].median_text()} | "
        f"{_vals(c.metrics['buffer'], 'time_to_target_s')}; reached "
        f"{t['buffer'].reached}/{t['buffer'].n}, median {t['buffer'].median_text()} | "
        f"{r.text()} | {r.method} |")
    r = c.ratios["updates_to_target"]
    lines.append(f"| updates to target (censored at the run's updates) | "
                 f"{_vals(c.metrics['learner'], 'updates_to_target')} | "
                 f"{_vals(c.metrics['buffer'], 'updates_to_target')} | {r.text()} | "
                 f"{r.method} |")
    lines.append(f"| delivered fraction of production (existing) | "
                 f"{_vals(c.metrics['learner'], 'delivered_fraction')} | | | |")
    d = c.decision
    regime = "deciding (the paper's regime)" if deciding(c) else \
        f"not deciding (existing delivered >= {DECIDING:.0%})"
    return "\n".join(lines) + (f"\n\nDecision: **{d.verdict}** ({d.reason}); {regime}.\n")


def crossover_map(cells: list[Cell]) -> str:
    """Markdown: per cell, which placement wins on time to target and on return per MB; as a
    grid when the cells have exactly two axes (rows: the first, columns: the second)."""
    axes = {tuple(k for k, _ in c.key) for c in cells}
    if len(axes) == 1 and len(next(iter(axes))) == 2:
        a, b = next(iter(axes))
        rows = sorted({c.key[0][1] for c in cells}, key=_sort_key)
        cols = sorted({c.key[1][1] for c in cells}, key=_sort_key)
        at = {(c.key[0][1], c.key[1][1]): c for c in cells}
        lines = [f"| {a} \\ {b} | " + " | ".join(cols) + " |", "|---|" + "---|" * len(cols)]
        for rv in rows:
            cells_txt = []
            for cv in cols:
                c = at.get((rv, cv))
                cells_txt.append("" if c is None else
                                 "<br>".join(f"{k}: {v}" for k, v in c.crossover.items()))
            lines.append(f"| {rv} | " + " | ".join(cells_txt) + " |")
        return "\n".join(lines) + "\n"
    lines = ["| cell | time to target | return per MB |", "|---|---|---|"]
    for c in cells:
        lines.append(f"| {c.label} | {c.crossover['time to target']} | "
                     f"{c.crossover['return per MB']} |")
    return "\n".join(lines) + "\n"


def plot_return_vs_link(c: Cell, runs: list[Run], path: Path) -> Path:
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
        name = PLACEMENT.get(r.replay_at, r.replay_at)
        ax.plot(M.link_mb_at(r, ev["t"]), ev["ret_mean"], "-", color=color, lw=1, alpha=0.8,
                label=None if name in seen else name)
        seen.add(name)
    ax.set_xlabel("cumulative link MB (both directions)")
    ax.set_ylabel("greedy return")
    ax.set_title(c.label)
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
    transfers, gaps inside a run's span interpolated: `analysis.plots.binned_mean`)."""
    from analysis.plots import binned_mean

    top = max((float(np.max(u)) for r in runs
               if len(u := r.learner.stream("updates").get("update", ()))), default=0.0)
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


def plot_curves(c: "Cell", runs: list[Run], path: Path) -> Path:
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
            ax.plot(x, med, color=color, label=PLACEMENT[place])
            ax.fill_between(x, lo, hi, color=color, alpha=0.25, lw=0)
        ax.set_xlabel("learner updates")
        ax.set_title(label, fontsize=9)
        if i == 0:
            ax.legend(fontsize=8)
    fig.suptitle(f"{c.label}: median and IQR across seeds", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return path


def paper_report(exp_dir: str | Path, report: str | Path, target: float | None = None,
                 plots: bool = True) -> list[Cell]:
    """The fixed-update Plan's report (docs/results/appendix/fixed-updates.md) from the HDF5
    files under ``exp_dir``: writes
    ``paper.md`` (per-cell tables, decisions, crossover map), ``paper-cells.csv`` (every run's
    metrics), ``paper-forest.png``, ``paper-<cell>-return-vs-link.png`` and
    ``paper-<cell>-curves.png`` (loss and priority curves, median and IQR) into ``report``."""
    from analysis import stats as S

    exp_dir, report = Path(exp_dir), Path(report)
    runs, errors = load_experiment(exp_dir)
    report.mkdir(parents=True, exist_ok=True)
    grouped = group_cells(runs, exp_dir)
    cells = [analyse_cell(k, rs, target) for k, rs in grouped.items()]
    lines = ["# The paper experiment: proposed / existing per cell", "",
             f"Experiment `{exp_dir}`: {len(runs)} runs in {len(cells)} cell(s). Metric "
             "definitions: `analysis.metrics.paper_metrics`; ratios, intervals, the decision "
             "and censoring: `analysis.stats` (docs/results/appendix/fixed-updates.md, Plan).", ""]
    if errors:
        lines += ["**Unreadable run folders:**", "", *[f"- {e}" for e in errors], ""]
    lines += ["## Verdict", "", headline(cells), "", "## Crossover map", "",
              crossover_map(cells), ""]
    forest = [c.ratios[k] for c in cells for k, _, f in CELL_METRICS if f]
    if plots and forest:
        S.forest_plot(forest, report / "paper-forest.png", title="proposed / existing per cell")
        lines += ["![forest plot](paper-forest.png)", ""]
    rows = []
    for c, rs in zip(cells, grouped.values()):
        lines += [f"## {c.label}", "", cell_table(c), ""]
        if plots:
            png = report / f"paper-{slugify(c.label)}-return-vs-link.png"
            plot_return_vs_link(c, rs, png)
            lines += [f"![return vs link MB: {c.label}]({png.name})", ""]
            png = report / f"paper-{slugify(c.label)}-curves.png"
            plot_curves(c, rs, png)
            lines += [f"![loss and priority curves: {c.label}]({png.name})", ""]
        rows += [{"cell": c.label, **m} for ms in c.metrics.values() for m in ms]
    if rows:
        keys = list(dict.fromkeys(k for m in rows for k in m))
        with open(report / "paper-cells.csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=keys)
            w.writeheader()
            w.writerows(rows)
    (report / "paper.md").write_text("\n".join(lines) + "\n")
    return cells


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m analysis.compare", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("experiment_dir", help="folder holding run folders (any depth)")
    ap.add_argument("--out", help="output folder (default EXPERIMENT_DIR/analysis)")
    ap.add_argument("--target", type=float, help="return target R for 'to target' (default: "
                    "the run's target_return, else the env's reward threshold)")
    ap.add_argument("--window", type=int, help="W: updates in the loss moving average "
                    f"(default clip(updates // 10, 10, {M.MAX_WINDOW}))")
    ap.add_argument("--tol", type=float, default=M.TOL, help="settling band around the final "
                    "loss level, relative (default %(default)s)")
    ap.add_argument("--no-plots", action="store_true", help="tables only (no matplotlib)")
    ap.add_argument("--report", help="also write the paper experiment's report (per-cell "
                    "tables with per-seed values and ratio CIs, decisions, crossover map, forest "
                    "plot, return vs link MB) into this folder: paper.md and its files")
    a = ap.parse_args(argv)
    if not Path(a.experiment_dir).is_dir():
        ap.error(f"experiment_dir={a.experiment_dir!r} is not a folder")
    profiles = compare(a.experiment_dir, a.out, target=a.target, window=a.window, tol=a.tol,
                       plots=not a.no_plots)
    out = Path(a.out) if a.out else Path(a.experiment_dir) / "analysis"
    if not profiles:
        print(f"no run folders (with learner.h5) under {a.experiment_dir}", file=sys.stderr)
        return 1
    for p in profiles:
        print(f"## {p.label}\n\n{p.table}")
    print(f"wrote {out / 'report.md'}")
    if a.report:
        paper_report(a.experiment_dir, a.report, target=a.target, plots=not a.no_plots)
        print(f"wrote {Path(a.report) / 'paper.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
