"""The analysis of experiments/weights-delta/: is learning with delta weights not worse?

    python experiments/weights_delta.py runs/weights-delta [--csv ROWS] [--json FILE]
    python experiments/weights_delta.py docs/results/data/weights-delta/runs.csv   # committed rows

Per env cell (``env=<label>``): each run's return AUC over its whole run (`run_figures`),
paired by seed across
``weights_encoding=full`` and ``=delta``; the ratio of geometric means delta / full with a 95%
t-interval on the paired log ratios (`analysis.paired.log_ratio_t`: it keeps its coverage at
n = 10, where a bootstrap interval does not).  Verdict "not worse" in a cell when the interval's
lower end is above 0.9 (it excludes a 10% loss); delta is called not worse only when both cells
say so, so the two tests need no multiplicity correction (an intersection-union test).  Also
per encoding: the mean bytes of a weight message and the median policy lag in updates
(``/progress weights_bytes``, ``lag_median``).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

LOSS = 0.9  # the interval must exclude a return ratio below this


def cells(root: Path) -> dict:
    """{env label: {encoding: {seed: run folder}}} from the sweep's folder names."""
    out: dict = {}
    for d in sorted(root.glob("*/seed*")):
        if not (d / "summary.json").exists() or not d.is_dir():
            continue
        axes = dict(kv.split("=", 1) for kv in d.parent.name.split(","))
        seed = int(re.sub(r"\D", "", d.name))
        out.setdefault(axes.get("env", "?"), {}).setdefault(axes["weights_encoding"], {})[seed] = d
    return out


def run_figures(d: Path) -> dict:
    """One run's figures: ``return`` = its return AUC over [0, T] (the mean of the held greedy
    evaluation curve, `analysis.export`'s rule; T = the run's wall time under its update budget,
    the same in both encodings as the learner is paced), ``final_return`` (evaluations in
    [0.75 T, T]), ``return_window`` (updates N/2..N), the achieved rates and link MB, the mean
    bytes of a weight message and the median policy lag."""
    from analysis.export import run_row
    from analysis.metrics import run_metrics
    from analysis.runs import load_run

    run = load_run(d)
    row = run_row(run, d.parent.parent)
    pr = run.learner.stream("progress")
    sent = np.asarray(pr.get("weights_sent", []), "f8")
    wbytes = np.asarray(pr.get("weights_bytes", []), "f8")
    ok = sent > 0
    return {
        "return": row["auc_return"],
        "final_return": row["final_return"],
        "return_window": run_metrics(run)["return_window"],
        **{k: row[k] for k in ("T", "updates", "U", "P", "evals", "link_mb", "load_max")},
        "weights_bytes": float(np.sum(wbytes[ok] * sent[ok]) / np.sum(sent[ok]))
        if ok.any()
        else math.nan,
        "lag_median": float(np.nanmedian(pr["lag_median"]))
        if len(pr.get("lag_median", []))
        else math.nan,
    }


FIELDS = (
    "env",
    "encoding",
    "seed",
    "return",
    "final_return",
    "return_window",
    "T",
    "updates",
    "U",
    "P",
    "evals",
    "link_mb",
    "load_max",
    "weights_bytes",
    "lag_median",
)


def rows(root: Path) -> list[dict]:
    """One row per finished run of the sweep under ``root`` (`FIELDS`), from its HDF5 files."""
    return [
        {"env": env, "encoding": enc, "seed": seed, **run_figures(d)}
        for env, by_enc in cells(root).items()
        for enc, runs in by_enc.items()
        for seed, d in sorted(runs.items())
    ]


def write_rows(path: Path, table: list[dict]) -> None:
    import csv

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, FIELDS, lineterminator="\n")
        w.writeheader()
        w.writerows(
            {k: (f"{r[k]:.6g}" if isinstance(r[k], float) else r[k]) for k in FIELDS} for r in table
        )


def read_rows(path: Path) -> list[dict]:
    import csv

    with open(path, newline="") as f:
        return [
            {**r, "seed": int(r["seed"]), **{k: float(r[k] or "nan") for k in FIELDS[3:]}}
            for r in csv.DictReader(f)
        ]


def summarize(table: list[dict]) -> dict:
    """Per env: the paired ratio delta / full of the returns, its verdict, and each encoding's
    median return, weight-message bytes and policy lag."""
    from analysis.paired import log_ratio_t

    res = {}
    for env in dict.fromkeys(r["env"] for r in table):
        by = {
            enc: {r["seed"]: r for r in table if r["env"] == env and r["encoding"] == enc}
            for enc in dict.fromkeys(r["encoding"] for r in table if r["env"] == env)
        }
        full, delta = by.get("full", {}), by.get("delta", {})
        r = log_ratio_t(
            {s: f["return"] for s, f in delta.items()},
            {s: f["return"] for s, f in full.items()},
        )
        fin = log_ratio_t(
            {s: f["final_return"] for s, f in delta.items()},
            {s: f["final_return"] for s, f in full.items()},
        )
        res[env] = {
            "final_ratio": fin.estimate,
            "final_low": fin.low,
            "final_high": fin.high,
            "ratio": r.estimate,
            "low": r.low,
            "high": r.high,
            "n": r.n,
            "method": "t on log ratios",
            "unpaired": r.unpaired,
            "not_worse": bool(r.low > LOSS),
            **{
                f"{enc}_{k}": float(np.nanmedian([f[k] for f in fs.values()]))
                for enc, fs in by.items()
                for k in ("return", "final_return", "weights_bytes", "lag_median", "U", "load_max")
            },
        }
    return res


def analyse(root: Path) -> dict:
    return summarize(rows(root))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("root", help="the sweep's folder (runs/weights-delta), or a rows CSV")
    ap.add_argument("--json", default=None, help="write the summary here")
    ap.add_argument("--csv", default=None, help="write the per-run rows here")
    a = ap.parse_args()
    src = Path(a.root)
    table = read_rows(src) if src.suffix == ".csv" else rows(src)
    if a.csv:
        write_rows(Path(a.csv), table)
    res = summarize(table)
    for env, r in res.items():
        print(
            f"{env}: return AUC delta/full {r['ratio']:.3f} [{r['low']:.3f}, {r['high']:.3f}] "
            f"(n={r['n']}, {r['method']}) -> "
            f"{'not worse (low > 0.9)' if r['not_worse'] else 'undecided'}; weights "
            f"{r.get('full_weights_bytes', math.nan):,.0f} B full vs "
            f"{r.get('delta_weights_bytes', math.nan):,.0f} B delta a message; lag "
            f"{r.get('full_lag_median', math.nan):.0f} vs "
            f"{r.get('delta_lag_median', math.nan):.0f}"
            " updates (median); final-window return delta/full "
            f"{r['final_ratio']:.3f} [{r['final_low']:.3f}, {r['final_high']:.3f}]"
        )
    if len(res) > 1:
        both = all(r["not_worse"] for r in res.values())
        print(f"delta {'is not worse in every env' if both else 'is not shown not worse'}")
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
