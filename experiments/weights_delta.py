"""The analysis of experiments/weights-delta/: is learning with delta weights not worse?

    python experiments/weights_delta.py runs/weights-delta [--csv ROWS] [--json FILE]
    python experiments/weights_delta.py docs/results/data/weights-delta/runs.csv \
        --update docs/benchmarks.md       # the committed rows -> the generated table there

Per env cell (``env=<label>``): each run's return AUC over its whole run (`run_figures`),
paired by seed across
``weights_encoding=full`` and ``=delta``; the ratio of geometric means delta / full with a 95%
t-interval on the paired log ratios (`analysis.stats.log_ratio_t`: it keeps its coverage at
n = 10, where a bootstrap interval does not).  Verdict "not worse" in a cell when the interval's
lower end is above 0.9 (it excludes a 10% loss); delta is called not worse only when both cells
say so, so the two tests need no multiplicity correction (an intersection-union test).  Which
cells decide: a confirmatory cell replaces its first stage (`CONFIRMS`), a fixed-cadence cell the
``--weights-every auto`` cell of its env (`FIXED`: with auto, delta's smaller messages also buy
more broadcasts, so that cell compares cadences too and stays reported as such); a deciding cell
with fewer pairs than planned leaves the decision pending.  Also per encoding: the mean bytes of
a weight message, the median policy lag in updates (``/progress weights_bytes``, ``lag_median``)
and the link MB of a whole run (``link_mb``: `analysis.export.run_row`'s, the learner's
``/link`` bytes in + out over [0, T], T the run's wall time for an update-budgeted run), since
with auto delta spends its savings on more broadcasts.
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
#: a confirmatory cell -> the first-stage cell it replaces in the decision (once planned, the
#: first stage is reported as its pilot, never pooled: see experiments/weights-delta/*-confirm.toml)
CONFIRMS = {"cartpole-confirm": "cartpole"}
#: a fixed-cadence cell -> the --weights-every auto cell it replaces in the decision: at auto,
#: delta also broadcast ~3x as often (experiments/weights-delta/minatar-fixed.toml), so the auto
#: cell measured cadence and encoding together; it stays reported as the cadence comparison
FIXED = {"minatar-fixed": "minatar"}


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
    """One run's figures: ``return`` = its return AUC, the mean of the held greedy-evaluation
    curve (`analysis.export.auc`) over the run's budget, the same in both encodings: [0, T] of
    wall time for a time-budgeted run (CartPole), [0, N] of updates for an update-budgeted one
    (MinAtar, whose wall time the weights' traffic can stretch); ``final_return`` (evaluations
    in [0.75 T, T]), ``return_window`` (updates N/2..N), the achieved rates and link MB, the
    mean bytes of a weight message and the median policy lag."""
    from analysis.export import auc, run_row
    from analysis.metrics import run_metrics
    from analysis.runs import load_run

    run = load_run(d)
    row = run_row(run, d.parent.parent)
    n = int(run.config.get("max_updates") or 0)
    if n:
        ev = run.learner.stream("evals")
        upd, ret = np.asarray(ev["update"], "f8"), np.asarray(ev["ret_mean"], "f8")
        order = np.argsort(upd, kind="stable")
        row["auc_return"] = auc(upd[order], ret[order], float(n))
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


def _key(r: dict) -> tuple:
    return r["env"], r["encoding"], int(r["seed"])


def write_rows(path: Path, table: list[dict]) -> None:
    """Merge ``table`` into the rows CSV at ``path``: a run in ``table`` replaces its row (same
    env, encoding and seed), the file's other rows are kept. Sittings on different machines
    (or an array's tasks) each add their runs; a run folder lost with its machine keeps its row."""
    import csv

    new = {_key(r): r for r in table}
    kept = [r for r in read_rows(path) if _key(r) not in new] if path.exists() else []
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w", newline="") as f:
        w = csv.DictWriter(f, FIELDS, lineterminator="\n")
        w.writeheader()
        w.writerows(
            {k: (f"{r[k]:.6g}" if isinstance(r[k], float) else r[k]) for k in FIELDS}
            for r in sorted([*kept, *new.values()], key=_key)
        )
    tmp.replace(path)


def read_rows(path: Path) -> list[dict]:
    import csv

    with open(path, newline="") as f:
        return [
            {**r, "seed": int(r["seed"]), **{k: float(r[k] or "nan") for k in FIELDS[3:]}}
            for r in csv.DictReader(f)
        ]


def _median(x: list[float]) -> float:
    """The median of the finite values, NaN when none is (rows from before a column existed)."""
    x = np.asarray(x, "f8")
    return float(np.median(x[np.isfinite(x)])) if np.isfinite(x).any() else math.nan


def summarize(table: list[dict]) -> dict:
    """Per env: the paired ratio delta / full of the returns, its verdict, and each encoding's
    median return, weight-message bytes and policy lag."""
    from analysis.stats import log_ratio_t

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
                f"{enc}_{k}": _median([f[k] for f in fs.values()])
                for enc, fs in by.items()
                for k in ("return", "final_return", "weights_bytes", "lag_median", "link_mb", "U")
            },
            # the highest load any run of the arm saw (not a median: a quiet-machine claim)
            **{
                f"{enc}_load_max": max(f["load_max"] for f in fs.values()) for enc, fs in by.items()
            },
        }
    return res


def analyse(root: Path) -> dict:
    return summarize(rows(root))


def planned() -> dict[str, int]:
    """Seeds each env cell plans (its spec under experiments/weights-delta/)."""
    from mpirl.sweep import load_spec

    out = {}
    for path in sorted((ROOT / "experiments" / "weights-delta").glob("*.toml")):
        spec = load_spec(path)
        for label, _ in spec.axes["env"]:
            out[label] = len(spec.seeds)
    return out


def _r(x: float, lo: float, hi: float, n: int) -> str:
    from analysis.stats import LogRatio

    return LogRatio(x, lo, hi, math.nan, n, math.nan).text() if math.isfinite(x) else "-"


def _mb(x: float) -> str:
    return f"{x:.1f}" if math.isfinite(x) else "-"


def markdown(res: dict, plan: dict[str, int]) -> str:
    """The results table and the verdict sentence, from `summarize`'s output."""
    lines = [
        "| cell | pairs | return AUC delta / full [95% t] | final-window return delta / full "
        "| bytes a weight message, full / delta | link MB a run, full / delta "
        "| median policy lag, full / delta (updates) | U full / delta (updates/s) | load max |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for env, r in res.items():
        want = plan.get(env, 0)
        g = {k: r.get(k, math.nan) for k in r} | {
            f"{e}_{k}": r.get(f"{e}_{k}", math.nan)
            for e in ("full", "delta")
            for k in ("weights_bytes", "lag_median", "link_mb", "U", "load_max")
        }
        fb, db = g["full_weights_bytes"], g["delta_weights_bytes"]
        fm, dm = g["full_link_mb"], g["delta_link_mb"]
        lines.append(
            f"| {env} | {r['n']} of {want} | {_r(r['ratio'], r['low'], r['high'], r['n'])} "
            f"| {_r(r['final_ratio'], r['final_low'], r['final_high'], r['n'])} "
            f"| {fb:,.0f} / {db:,.0f} B ({fb / db:.1f}x) "
            f"| {_mb(fm)} / {_mb(dm)} "
            f"| {g['full_lag_median']:.0f} / {g['delta_lag_median']:.0f} "
            f"| {g['full_U']:.1f} / {g['delta_U']:.1f} "
            f"| {max(g['full_load_max'], g['delta_load_max']):.1f} |"
        )
    lines += [
        f"| {env} | 0 of {want} | not yet run | - | - | - | - | - | - |"
        for env, want in plan.items()
        if env not in res
    ]
    pilots = {CONFIRMS[c]: c for c in plan if c in CONFIRMS}
    cadence = {FIXED[c]: c for c in plan if c in FIXED}
    decide = [env for env in plan if env not in pilots and env not in cadence]
    verdicts = []
    for env, r in res.items():
        if env in pilots:
            verdicts.append(
                f"{env}: first stage, n = {r['n']}, lower end {r['low']:.3g} (a pilot now: "
                f"{pilots[env]} decides)"
            )
        elif env in cadence:
            verdicts.append(
                f"{env}: at --weights-every auto, a cadence comparison, not the decision "
                f"({_r(r['ratio'], r['low'], r['high'], r['n'])}, but delta's weights also went "
                f"out more often: median lag {r.get('delta_lag_median', math.nan):.0f} against "
                f"{r.get('full_lag_median', math.nan):.0f} updates; {cadence[env]} decides at "
                "a fixed cadence)"
            )
        elif env in FIXED and r["n"] < plan.get(env, 0):
            verdicts.append(
                f"{env}: {r['n']} of {plan[env]} pairs so far, so the {FIXED[env]} decision "
                "is pending"
            )
        elif r["n"] < plan.get(env, 0):  # a cell decides only at its planned pairs
            verdicts.append(f"{env}: {r['n']} of {plan[env]} pairs so far")
        elif r["not_worse"]:
            verdicts.append(f"{env}: not worse (the interval's lower end {r['low']:.3g} > {LOSS})")
        elif not math.isfinite(r["low"]):
            verdicts.append(f"{env}: no interval yet at n = {r['n']}")
        else:
            verdicts.append(
                f"{env}: inconclusive at n = {r['n']} (lower end {r['low']:.3g}, not above {LOSS})"
            )
    missing = [env for env in decide if env not in res]
    short = [env for env in decide if env in missing or res[env]["n"] < plan[env]]
    if short:
        head = (
            "Interim, not decided (a deciding cell has fewer pairs than planned: "
            f"{', '.join(short)})"
        )
        verdicts += [
            f"{env}: not yet run, so the {FIXED[env]} decision is pending"
            if env in FIXED
            else f"{env}: no pairs yet"
            for env in missing
        ]
    elif all(res[env]["not_worse"] for env in decide):
        head = "**delta is not worse than full weights in every cell**"
    else:
        head = "**delta is not shown to be not worse in every cell**"
    return "\n".join([*lines, "", f"{head}. " + "; ".join(verdicts) + "."])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("root", help="the sweep's folder (runs/weights-delta), or a rows CSV")
    ap.add_argument("--json", default=None, help="write the summary here")
    ap.add_argument(
        "--csv", default=None, help="merge the per-run rows into this CSV (a run's row replaced)"
    )
    ap.add_argument("--update", default=None, help="rewrite this page's generated section")
    ap.add_argument("--check", default=None, help="exit 1 if this page's section differs")
    a = ap.parse_args()
    src = Path(a.root)
    table = read_rows(src) if src.suffix == ".csv" else rows(src)
    if a.csv:
        write_rows(Path(a.csv), table)
    res = summarize(table)
    text = markdown(res, planned())
    print(text)
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1))
    from analysis.verdict import update_or_check

    for page, write in ((a.update, True), (a.check, False)):
        update_or_check(page, "weights_delta", text, str(src), write)


if __name__ == "__main__":
    main()
