"""Compare the two replay placements over an experiment: tables, plots and ``report.md``.

    python -m analysis.compare EXPERIMENT_DIR [--out DIR] [--target R] [--window W] [--tol TOL]
                                              [--report DIR]

EXPERIMENT_DIR holds run folders at any depth (a run folder contains ``learner.h5``). The profile
report (`analysis.profile`) groups them by **link profile** (config ``env``, ``link`` and the
overrides ``latency_ms``, ``bandwidth_mbps``, ``jitter_ms``, ``link_change`` when set) and,
within a profile, by **placement** (``replay_at``: ``learner``, the paper's existing, Ape-X
style; ``buffer``, the paper's proposed); the runs of a group are its seeds. A config key (other
than seeds, budgets and output settings) that differs between runs of one placement splits it
into variants (``inflight=1``, ...). ``--report DIR`` adds the paper report (`analysis.paper`):
per cell of the sweep, per-seed values, ratios with intervals, the decision, the crossover map.

Output in ``--out`` (default EXPERIMENT_DIR/analysis): ``report.md`` (every table, links to the
plots, one row per run), ``<profile>.md`` (the profile's table), ``<profile>-{loss,priority,
return,link}.png``, ``runs.csv`` (every per-run metric). Metric definitions: `analysis.metrics`
and docs/hdf5.md. Works on runs still being written and on killed runs (`analysis.runs`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from analysis import metrics as M
from analysis.paper import paper_report
from analysis.profile import profile_report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m analysis.compare",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("experiment_dir", help="folder holding run folders (any depth)")
    ap.add_argument("--out", help="output folder (default EXPERIMENT_DIR/analysis)")
    ap.add_argument(
        "--target",
        type=float,
        help="return target R for 'to target' (default: "
        "the run's target_return, else the env's reward threshold)",
    )
    ap.add_argument(
        "--window",
        type=int,
        help="W: updates in the loss moving average "
        f"(default clip(updates // 10, 10, {M.MAX_WINDOW}))",
    )
    ap.add_argument(
        "--tol",
        type=float,
        default=M.TOL,
        help="settling band around the final loss level, relative (default %(default)s)",
    )
    ap.add_argument("--no-plots", action="store_true", help="tables only (no matplotlib)")
    ap.add_argument(
        "--report",
        help="also write the paper experiment's report (per-cell "
        "tables with per-seed values and ratio CIs, decisions, crossover map, forest "
        "plot, return vs link MB) into this folder: paper.md and its files",
    )
    a = ap.parse_args(argv)
    if not Path(a.experiment_dir).is_dir():
        ap.error(f"experiment_dir={a.experiment_dir!r} is not a folder")
    profiles = profile_report(
        a.experiment_dir, a.out, target=a.target, window=a.window, tol=a.tol, plots=not a.no_plots
    )
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
