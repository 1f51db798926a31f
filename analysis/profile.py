"""The profile report: the two placements side by side in each link profile (a cell whose axes
are the link keys, `analysis.cells`), with means over seeds, ratios and time-series plots.

Output in ``out``: ``report.md`` (every table, links to the plots, one row per run),
``<profile>.md`` (the profile's table), ``<profile>-{loss,priority,return,link}.png``, ``runs.csv``
(every per-run metric, `analysis.metrics.run_metrics`).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from analysis import metrics as M
from analysis.cells import PAPER_TERM, Cell, Group, group
from analysis.runs import load_experiment
from analysis.stats import PAPER_LOSS, PAPER_PRIORITY
from analysis.tables import md_table, nbytes, num, write_csv

__all__ = ["ROWS", "mean_ratio", "profile_report", "profile_table"]

# The paper's ratios buffer / learner after convergence (loss, transferred priority).
PAPER = {
    "train_loss_conv": PAPER_LOSS,
    "prio_held_conv": PAPER_PRIORITY,
    "arrival_prio_conv": PAPER_PRIORITY,
}

ROWS = [  # (metric key, row label, cell kind)
    ("updates", "learner updates", "num"),
    ("env_steps", "env steps", "num"),
    ("conv", "after-convergence window", "conv"),
    ("train_loss_conv", "training loss after convergence", "num"),
    ("prio_held_conv", "transferred priority after convergence: held by sender", "num"),
    (
        "arrival_prio_conv",
        "transferred priority after convergence: on arrival (learner's net)",
        "num",
    ),
    ("arrival_td_conv", "transferred \\|td\\| after convergence: on arrival", "num"),
    ("link_bytes_per_update", "link bytes per learner update (both directions)", "bytes"),
    ("link_bytes_total", "link bytes in total (both directions)", "bytes"),
    ("link_bytes_in", "link bytes toward the learner", "bytes"),
    ("link_bytes_out", "link bytes toward the buffers", "bytes"),
    ("env_steps_to_target", "env steps to target return", "target"),
    ("time_to_target_s", "wall time to target return (s)", "target"),
    ("final_eval", "final greedy return (last eval)", "num"),
    ("best_eval", "best greedy return", "num"),
]
RATIO_ROWS = {
    "train_loss_conv",
    "prio_held_conv",
    "arrival_prio_conv",
    "arrival_td_conv",
    "link_bytes_per_update",
    "link_bytes_total",
    "link_bytes_in",
    "link_bytes_out",
    "env_steps_to_target",
    "time_to_target_s",
    "final_eval",
    "updates",
    "env_steps",
}


def _n(ok: np.ndarray, n: int) -> str:
    return f"n={len(ok)}{'' if len(ok) == n else f'/{n}'}"


def _cell(g: Group, key: str, fmt=num) -> str:
    """Mean over seeds (min–max, n = seeds with a value)."""
    v = g.values(key)
    ok = v[np.isfinite(v)]
    if not len(ok):
        return "n/a"
    if len(ok) == 1:
        return f"{fmt(ok[0])} ({_n(ok, len(v))})"
    return f"{fmt(ok.mean())} ({fmt(ok.min())}–{fmt(ok.max())}, {_n(ok, len(v))})"


def _target_cell(g: Group, key: str) -> str:
    v = g.values(key)
    ok = v[np.isfinite(v)]
    if not len(ok):
        return f"not reached (0/{len(v)})"
    core = num(ok.mean()) if len(ok) == 1 else f"{num(ok.mean())} ({num(ok.min())}–{num(ok.max())})"
    return f"{core}, {len(ok)}/{len(v)} reached"


def _conv_cell(g: Group) -> str:
    parts = []
    for method in ("settled", "fallback", "none"):
        ms = [m for m in g.metrics if m["conv_method"] == method]
        if not ms:
            continue
        ups = sorted(m["conv_update"] for m in ms)
        where = (
            f"from update {ups[0]:,}" if len(ups) == 1 else f"from updates {ups[0]:,}–{ups[-1]:,}"
        )
        name = {"settled": "settled", "fallback": "fallback: last 25%", "none": "no updates"}[
            method
        ]
        parts.append(f"{name} ×{len(ms)}" + (f", {where}" if method != "none" else ""))
    return "; ".join(parts)


def mean_ratio(num_: Group, den: Group, key: str) -> float:
    """mean over ``num_``'s seeds / mean over ``den``'s seeds (NaN when either is missing)."""
    a, b = num_.mean(key), den.mean(key)
    return a / b if np.isfinite(a) and np.isfinite(b) and b != 0 else float("nan")


def _row(key: str, kind: str, groups: list[Group], pairs: list[tuple[Group, Group]]) -> list[str]:
    cells = []
    for g in groups:
        if kind == "conv":
            cells.append(_conv_cell(g))
        elif kind == "target":
            cells.append(_target_cell(g, key))
        else:
            cells.append(_cell(g, key, nbytes if kind == "bytes" else num))
    for gb, gl in pairs:
        if kind == "target" and not all(np.isfinite(g.values(key)).all() for g in (gb, gl)):
            cells.append("n/a")  # a mean over the seeds that reached it would flatter
        else:
            cells.append(num(mean_ratio(gb, gl, key)) if key in RATIO_ROWS else "")
    cells.append(num(PAPER[key]) if key in PAPER else "")
    return cells


def profile_table(p: Cell) -> str:
    """The markdown table of one profile: one column per placement (variant), then the ratios
    buffer / learner (the paper's proposed / existing; means over seeds) and the paper's."""
    at_learner = [g for g in p.groups if g.replay_at == "learner"]
    at_buffer = [g for g in p.groups if g.replay_at == "buffer"]
    pairs = [(g, at_learner[0]) for g in at_buffer] if at_learner else []
    targets = sorted({m["target"] for g in p.groups for m in g.metrics if m["target"] is not None})
    tgt = "/".join(f"{t:g}" for t in targets) if targets else "none"
    head = ["metric", *(g.label for g in p.groups)]
    multi = len(pairs) > 1
    head += [f"proposed / existing{f' ({gb.label})' if multi else ''}" for gb, _ in pairs]
    head.append("paper (proposed / existing)")
    rows = []
    for key, label, kind in ROWS:
        if kind == "target":
            label = f"{label}, R = {tgt}"
        rows.append([label, *_row(key, kind, p.groups, pairs)])
    seeds = "; ".join(
        f"{g.label}: seeds {', '.join(str(r.seed) for r in g.runs)}" for g in p.groups
    )
    notes = [
        "",
        f"Cells: mean over seeds (min–max, n = seeds with a value). {seeds}.",
        (
            "After convergence: from the update where the loss's moving average settles within "
            "±tol of its final level (`settled`), else the last 25% of updates (`fallback`); "
            "see analysis/metrics.py. Transferred priorities are weighted by transitions per "
            "message."
        ),
        (
            "Paper ratios: loss 0.26 and transferred priority 3.92 after convergence (the paper "
            "gives one priority figure; both definitions are shown beside it)."
        ),
    ]
    if not at_learner or not at_buffer:
        notes.append("Only one placement in this profile: no ratios.")
    if len(at_learner) > 1:
        notes.append(f"Several existing variants: ratios use {at_learner[0].label}.")
    return md_table(head, rows) + "\n".join(notes) + "\n"


def _runs_table(profiles: list[Cell], exp_dir: Path) -> str:
    head = [
        "run",
        "placement",
        "seed",
        "stop",
        "summary",
        "updates",
        "after conv.",
        "loss",
        "prio held",
        "prio arrival",
        "bytes/update",
        "final eval",
    ]
    rows = []
    for p in profiles:
        for g in p.groups:
            for r, m in zip(g.runs, g.metrics, strict=True):
                try:
                    name = str(r.path.relative_to(exp_dir)) or "."
                except ValueError:
                    name = str(r.path)
                rows.append(
                    [
                        name,
                        g.replay_at,
                        str(r.seed),
                        str(m["stop_reason"]),
                        m["summary_source"],
                        f"{m['updates']:,}",
                        f"{m['conv_method']} @ {m['conv_update']:,}",
                        num(m["train_loss_conv"]),
                        num(m["prio_held_conv"]),
                        num(m["arrival_prio_conv"]),
                        nbytes(m["link_bytes_per_update"] or np.nan),
                        num(m["final_eval"] if m["final_eval"] is not None else np.nan),
                    ]
                )
    return md_table(head, rows)


def profile_report(
    exp_dir: str | Path,
    out: str | Path | None = None,
    target: float | None = None,
    window: int | None = None,
    tol: float = M.TOL,
    plots: bool = True,
) -> list[Cell]:
    """Read every run under ``exp_dir``, write tables, plots, ``runs.csv`` and ``report.md``
    into ``out`` (default ``exp_dir/analysis``); returns the profiles (groups, metrics, tables).
    """
    exp_dir = Path(exp_dir)
    out = Path(out) if out is not None else exp_dir / "analysis"
    runs, errors = load_experiment(exp_dir)
    profiles = group(runs, by="link")
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for p in profiles:
        for g in p.groups:
            g.metrics = [M.run_metrics(r, target=target, window=window, tol=tol) for r in g.runs]
            rows += [{"profile": p.label, "group": g.label, **m} for m in g.metrics]
        p.table = profile_table(p)
        (out / f"{p.slug}.md").write_text(f"# {p.label}\n\n" + p.table)
        if plots:
            p.plots = _plot(p, out)
    write_csv(out / "runs.csv", rows)
    (out / "report.md").write_text(report_markdown(exp_dir, profiles, errors, window, tol))
    return profiles


def _plot(p: Cell, out: Path) -> dict[str, Path]:
    from analysis.plots import plot_profile

    conv_t = {
        g.label: float(np.nanmedian(g.values("conv_t")))
        for g in p.groups
        if np.isfinite(g.values("conv_t")).any()
    }
    return plot_profile(p.label, {g.label: g.runs for g in p.groups}, out, p.slug, conv_t)


def report_markdown(
    exp_dir: Path, profiles: list[Cell], errors: list[str], window: int | None, tol: float
) -> str:
    n_runs = sum(len(g.runs) for p in profiles for g in p.groups)
    w = f"W = {window}" if window else f"W = clip(updates // 10, 10, {M.MAX_WINDOW})"
    lines = [
        "# mpirl: existing vs proposed replay placement",
        "",
        (
            f"Experiment `{exp_dir}`: {n_runs} runs in {len(profiles)} link profile(s); "
            f"generated {time.strftime('%Y-%m-%d %H:%M:%S')}."
        ),
        "",
        (
            f"- **{PAPER_TERM['learner']}** = `replay_at=learner` (Ape-X style: every experience "
            f"crosses the link); **{PAPER_TERM['buffer']}** = `replay_at=buffer` (only prioritized "
            "batches cross)."
        ),
        (
            f"- **after convergence**: per run, from the first update `j*` after which the moving "
            f"average of the loss over {w} updates stays within ±{tol:.0%} of its final level (the "
            f"mean of the last W updates), if that window holds at least max(W, 10% of the "
            f"updates); otherwise the last 25% of the updates (`fallback`). Transfers count when "
            f"their `t` is at or after update `j*`'s."
        ),
        (
            "- **transferred priority**: `held by sender` = `transfers/priority_mean` (the "
            "buffer's memory, or the actors' initial priority when forwarding), `on arrival` = "
            "`transfers/arrival_priority_mean` ((|td|+eps)^alpha under the learner's network); "
            "means weighted by `transfers/n`."
        ),
        (
            "- **link bytes**: the learner's side of the link, both directions "
            "(`summary.json` `link_bytes_in` + `link_bytes_out`)."
        ),
        (
            "- **to target**: `summary.json` `time_to_target_s` / `env_steps_to_target`, or the "
            "first greedy eval with mean return >= R."
        ),
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
    lines += [
        "## Runs",
        "",
        _runs_table(profiles, exp_dir),
        "",
        "Every per-run metric: `runs.csv`.",
    ]
    return "\n".join(lines) + "\n"
