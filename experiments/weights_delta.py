"""The analysis of experiments/weights-delta.toml: is learning with delta weights not worse?

    python experiments/weights_delta.py runs/weights-delta [--json FILE]

Per env cell (``env=<label>``): each run's mean greedy return over updates N/2..N
(`analysis.metrics.run_metrics` ``return_window``), paired by seed across
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
    from analysis.metrics import run_metrics
    from analysis.runs import load_run

    run = load_run(d)
    pr = run.learner.stream("progress")
    sent = np.asarray(pr.get("weights_sent", []), "f8")
    wbytes = np.asarray(pr.get("weights_bytes", []), "f8")
    ok = sent > 0
    return {
        "return": run_metrics(run)["return_window"],
        "weights_bytes": float(np.sum(wbytes[ok] * sent[ok]) / np.sum(sent[ok]))
        if ok.any()
        else math.nan,
        "lag_median": float(np.nanmedian(pr["lag_median"]))
        if len(pr.get("lag_median", []))
        else math.nan,
    }


def analyse(root: Path) -> dict:
    from analysis.paired import log_ratio_t

    res = {}
    for env, by_enc in cells(root).items():
        figs = {enc: {s: run_figures(d) for s, d in runs.items()} for enc, runs in by_enc.items()}
        full, delta = figs.get("full", {}), figs.get("delta", {})
        r = log_ratio_t(
            {s: f["return"] for s, f in delta.items()},
            {s: f["return"] for s, f in full.items()},
        )
        res[env] = {
            "ratio": r.estimate,
            "low": r.low,
            "high": r.high,
            "n": r.n,
            "method": "t on log ratios",
            "unpaired": r.unpaired,
            "not_worse": bool(r.low > LOSS),
            **{
                f"{enc}_{k}": float(np.nanmedian([f[k] for f in fs.values()]))
                for enc, fs in figs.items()
                for k in ("return", "weights_bytes", "lag_median")
            },
        }
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("root")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    res = analyse(Path(a.root))
    for env, r in res.items():
        print(
            f"{env}: return delta/full {r['ratio']:.3f} [{r['low']:.3f}, {r['high']:.3f}] "
            f"(n={r['n']}, {r['method']}) -> "
            f"{'not worse (low > 0.9)' if r['not_worse'] else 'undecided'}; weights "
            f"{r.get('full_weights_bytes', math.nan):,.0f} B full vs "
            f"{r.get('delta_weights_bytes', math.nan):,.0f} B delta a message; lag "
            f"{r.get('full_lag_median', math.nan):.0f} vs "
            f"{r.get('delta_lag_median', math.nan):.0f}"
            " updates (median)"
        )
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
