"""The analysis of experiments/learner-group/ (plan: experiments/learner-group/plan.md): K = 2
learners on CartPole-v1, one of them 4x slower for the middle third of each run; which
--learner-sync mode learns fastest in equal wall time?

    python experiments/learner_group.py runs/learner-group [--csv ROWS] [--json FILE]
    python experiments/learner_group.py docs/results/data/learner-group/runs.csv \
        --update docs/benchmarks.md       # the committed rows -> the generated table there

Per run (`run_figures`, on the learner's loop clock, T its horizon): ``ttt`` the time to target
(the first greedy evaluation at or above 475, `analysis.export.run_row`'s rule), censored at T
(``reached`` 0); ``auc_return`` the mean held evaluation return over [0, T]; ``updates`` and
``updates_to_target`` (the update count at that evaluation: the per-update outcome); global
updates/s and samples/s (/updates rows, and /group's samples not dropped) in each phase,
``before`` [0, S), ``during`` [S, E) and ``after`` [E, T], with [S, E) the --straggle window
on the lead's loop clock (`window`); ``switches`` (/switches rows); ``lag_mean`` (the mean
/group lag of the gradients applied: updates between the weights a gradient was computed on and
its update; described, added after the runs began).

The decision (plan.md): four paired comparisons, each of seed-paired runs: gba - allreduce,
switch - allreduce, async - allreduce, switch - gba.  Primary outcome: the difference in
restricted time to target, d_i = min(ttt_a, tau) - min(ttt_b, tau) with tau the shortest
horizon; with every censoring at tau the mean of min(ttt, tau) over seeds is each mode's
Kaplan-Meier restricted mean (`analysis.stats.rmst`, also reported), so mean d is the RMST
difference.  Its t-interval at the Bonferroni level 1 - 0.05/4 and the paired t-test's p x 4:
the p-value is below 0.05 exactly when the interval excludes 0, so the decision and the interval
cannot disagree.  Secondary: the return-AUC ratio (paired t on log ratios,
`analysis.stats.log_ratio_t`) at the same level; per-phase updates/s, updates to target and the
return figures are described, not tested.  A comparison decides only at its planned pairs.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SPEC = ROOT / "experiments" / "learner-group" / "straggle-window.toml"
#: no straggler (plan.md, H5)
HEALTHY = ROOT / "experiments" / "learner-group" / "healthy.toml"
MODES = ("allreduce", "async", "gba", "switch")
#: the family (plan.md): (a, b) tests a - b
COMPARISONS = (("gba", "allreduce"), ("switch", "allreduce"), ("async", "allreduce"),
               ("switch", "gba"))  # fmt: skip
ALPHA = 0.05
#: H5 (plan.md): switch's return AUC equivalent to allreduce's with no straggler when the 90%
#: interval of the ratio lies inside [MARGIN, 1 / MARGIN] (TOST at alpha 0.05)
MARGIN = 0.9
#: the two sweeps under the runs folder: with the straggler window (the family) and without
CONDITIONS = ("straggle", "healthy")
PHASES = ("before", "during", "after")
FIELDS = (
    "mode",
    "seed",
    "T",
    "reached",
    "ttt",
    "auc_return",
    "final_return",
    "updates",
    "updates_to_target",
    *(f"ups_{p}" for p in PHASES),
    *(f"sps_{p}" for p in PHASES),
    "window_start",
    "window_end",
    "switches",
    "load_max",
    "lag_mean",
)


def cells(root: Path) -> dict[str, dict[int, Path]]:
    """{mode: {seed: run folder}} from the sweep's folder names (finished runs only)."""
    out: dict[str, dict[int, Path]] = {}
    for d in sorted(root.glob("*/seed*")):
        if not d.is_dir() or not (d / "summary.json").exists():
            continue
        axes = dict(kv.split("=", 1) for kv in d.parent.name.split(","))
        seed = int(re.sub(r"\D", "", d.name))
        out.setdefault(axes["learner_sync"], {})[seed] = d
    return out


def window(run: Any) -> tuple[float, float]:
    """The --straggle window [S, E) as given, read on the lead's loop clock; (inf, inf) without
    a window.  The straggler counts it from its own sync's creation, after its set-up, as the
    lead's loop starts after the lead's: in the check runs (K = 2, learner 1 straggling) its
    compute time per batch (learner-1.h5:/work) rose within ~0.3 s of S on that clock.  Its own
    file's t0_unix is no better: that is taken before its set-up, seconds earlier."""
    from mpirl.run.config import parse_straggle

    text = run.config.get("straggle")
    if not text:
        return math.inf, math.inf
    _, _, start, end = parse_straggle(str(text))
    return start, end


def phase_rates(run: Any, big_t: float, s: float, e: float) -> dict[str, float]:
    """Global updates/s and samples/s in each phase (NaN for an empty phase)."""
    t = np.asarray(run.learner.stream("updates").get("t", []), "f8")
    g = run.learner.stream("group")
    gt = np.asarray(g.get("t", []), "f8")
    ok = np.asarray(g.get("dropped", np.zeros(gt.size)), "f8") == 0
    n = np.asarray(g.get("samples", np.zeros(gt.size)), "f8")
    out = {}
    edges = {"before": (0.0, s), "during": (s, e), "after": (e, big_t)}
    for p, (a, b) in edges.items():
        a, b = max(a, 0.0), min(b, big_t)
        span = b - a
        if not span > 0:
            out[f"ups_{p}"] = out[f"sps_{p}"] = math.nan
            continue
        out[f"ups_{p}"] = float(((t >= a) & (t < b)).sum()) / span
        out[f"sps_{p}"] = float(n[ok & (gt >= a) & (gt < b)].sum()) / span
    return out


def run_figures(d: Path) -> dict[str, Any]:
    """One run's row (`FIELDS` but mode and seed; module docstring)."""
    from analysis.export import horizon, run_row
    from analysis.runs import load_run

    run = load_run(d)
    row = run_row(run, d.parent.parent)
    big_t = horizon(run)
    s, e = window(run)
    ev = run.learner.stream("evals")
    te, upd = np.asarray(ev.get("t", []), "f8"), np.asarray(ev.get("update", []), "f8")
    ret = np.asarray(ev.get("ret_mean", []), "f8")
    order = np.argsort(te, kind="stable")  # as run_row reads them
    te, upd, ret = te[order], upd[order], ret[order]
    hit = np.flatnonzero((te <= big_t) & (ret >= row["target"]))
    return {
        "T": big_t,
        "reached": int(bool(row["reached"])),
        "ttt": row["time_to_target_s"],
        "auc_return": row["auc_return"],
        "final_return": row["final_return"],
        "updates": float(row["updates"] or 0),
        "updates_to_target": float(upd[hit[0]]) if hit.size else math.nan,
        **phase_rates(run, big_t, s, e),
        "window_start": s,
        "window_end": e,
        "switches": len(run.learner.stream("switches").get("t", [])),
        "load_max": row["load_max"],
        "lag_mean": lag_mean(run),
    }


def lag_mean(run: Any) -> float:
    """Mean /group ``lag`` of the contributions applied: updates between the weights a gradient
    was computed on and the update it went into (0 for all-reduce; described, added to the
    analysis after the runs began, to read the modes' return per update)."""
    g = run.learner.stream("group")
    lag = np.asarray(g.get("lag", []), "f8")
    ok = np.asarray(g.get("dropped", np.zeros(lag.size)), "f8") == 0
    return float(lag[ok].mean()) if ok.any() else math.nan


def rows(root: Path) -> list[dict[str, Any]]:
    """One row per finished run of the two sweeps under ``root`` (``root/straggle``,
    ``root/healthy``: `CONDITIONS`), each row with its ``condition``."""
    return [
        {"condition": cond, "mode": mode, "seed": seed, **run_figures(d)}
        for cond in CONDITIONS
        for mode, runs in cells(root / cond).items()
        for seed, d in sorted(runs.items())
    ]


def _key(r: dict[str, Any]) -> tuple[int, int, int]:
    cond = r.get("condition") or "straggle"
    return CONDITIONS.index(cond), MODES.index(r["mode"]), int(r["seed"])


def write_rows(path: Path, table: list[dict[str, Any]]) -> None:
    """Merge ``table`` into the rows CSV at ``path``: a run in ``table`` replaces its row (same
    mode and seed), the file's other rows are kept."""
    import csv

    new = {_key(r): r for r in table}
    kept = [r for r in read_rows(path) if _key(r) not in new] if path.exists() else []
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w", newline="") as f:
        w = csv.DictWriter(f, ("condition", *FIELDS), lineterminator="\n")
        w.writeheader()
        w.writerows(
            {
                "condition": r.get("condition") or "straggle",
                **{k: (f"{r[k]:.6g}" if isinstance(r[k], float) else r[k]) for k in FIELDS},
            }
            for r in sorted([*kept, *new.values()], key=_key)
        )
    tmp.replace(path)


def read_rows(path: Path) -> list[dict[str, Any]]:
    import csv

    with open(path, newline="") as f:
        return [
            {
                **r,
                "condition": r.get("condition") or "straggle",
                "seed": int(r["seed"]),
                **{k: float(r[k] or "nan") for k in FIELDS[2:]},
            }
            for r in csv.DictReader(f)
        ]


def restricted_diff(a: dict[int, dict], b: dict[int, dict], tau: float, m: int) -> dict:
    """The paired difference of restricted times to target, a - b, over the seeds both have:
    mean, its t-interval at level 1 - ALPHA / m, the two-sided paired t-test's p x m (capped
    at 1), and the decision read off the interval."""
    from scipy import stats

    seeds = sorted(set(a) & set(b))
    d = np.array([min(a[s]["ttt"], tau) - min(b[s]["ttt"], tau) for s in seeds], "f8")
    n = d.size
    out: dict[str, Any] = {"n": n, "diff": float(d.mean()) if n else math.nan}
    if n < 2:
        return out | {"low": math.nan, "high": math.nan, "p_adj": math.nan, "call": "no test"}
    sd = float(d.std(ddof=1))
    if sd == 0:  # every seed the same difference: a point
        lo = hi = out["diff"]
        p = 1.0 if lo == 0 else 0.0
    else:
        half = stats.t.ppf(1 - ALPHA / m / 2, n - 1) * sd / math.sqrt(n)
        lo, hi = out["diff"] - half, out["diff"] + half
        p = float(stats.ttest_1samp(d, 0.0).pvalue)
    call = "sooner" if hi < 0 else "later" if lo > 0 else "no difference shown"
    return out | {"low": lo, "high": hi, "p_adj": min(1.0, p * m), "call": call}


def _nanmean(x: list[float]) -> float:
    a = np.asarray(x, "f8")
    return float(a[np.isfinite(a)].mean()) if np.isfinite(a).any() else math.nan


def mode_summary(runs: dict[int, dict], tau: float) -> dict[str, float]:
    """One mode's figures over its seeds: reached, KM restricted mean and median time to target
    (censored at tau), mean return AUC, median updates to target and mean updates/s per phase."""
    from analysis.stats import rmst, time_to_target

    rs = list(runs.values())
    if not rs:
        return {"n": 0}
    ttt = np.array([min(r["ttt"], tau) for r in rs], "f8")
    event = np.array([bool(r["reached"]) and r["ttt"] <= tau for r in rs])
    mean, _ = rmst(ttt, event, tau)
    med = time_to_target([r["ttt"] if e else None for r, e in zip(rs, event, strict=True)], tau)
    utt = [r["updates_to_target"] for r, e in zip(rs, event, strict=True) if e]
    return {
        "n": len(rs),
        "reached": int(event.sum()),
        "rmst": mean,
        "median": med.median,
        "auc": float(np.mean([r["auc_return"] for r in rs])),
        "updates_to_target": float(np.median(utt)) if utt else math.nan,
        "updates": float(np.mean([r["updates"] for r in rs])),
        "lag": _nanmean([r.get("lag_mean", math.nan) for r in rs]),
        **{f"ups_{p}": _nanmean([r[f"ups_{p}"] for r in rs]) for p in PHASES},
    }


def _with_switches(runs: dict[int, dict], tau: float) -> dict[str, float]:
    return mode_summary(runs, tau) | {"switches": _nanmean([r["switches"] for r in runs.values()])}


def healthy(table: list[dict[str, Any]]) -> dict[str, Any]:
    """H5 (plan.md) on the no-straggler rows: switch / allreduce return AUC, its 90% interval
    (equivalence within [MARGIN, 1 / MARGIN]) and 95% interval (a difference), the restricted
    time-to-target difference with its 95% interval, and each mode's figures."""
    from analysis.stats import log_ratio_t

    by = {m: {int(r["seed"]): r for r in table if r["mode"] == m} for m in ("allreduce", "switch")}
    tau = min((r["T"] for r in table), default=math.nan)
    auc = {s: r["auc_return"] for s, r in by["switch"].items()}
    ref = {s: r["auc_return"] for s, r in by["allreduce"].items()}
    r90, r95 = log_ratio_t(auc, ref, 1 - 2 * ALPHA), log_ratio_t(auc, ref, 1 - ALPHA)
    equivalent = r90.n >= 2 and MARGIN <= r90.low and r90.high <= 1 / MARGIN
    differs = r95.n >= 2 and (r95.low > 1 or r95.high < 1)
    return {
        "tau": tau,
        "modes": {k: _with_switches(v, tau) for k, v in by.items()},
        "n": r90.n,
        "auc_ratio": r90.estimate,
        "auc_low90": r90.low,
        "auc_high90": r90.high,
        "auc_low95": r95.low,
        "auc_high95": r95.high,
        "equivalent": equivalent,
        "differs": differs,
        "ttt": restricted_diff(by["switch"], by["allreduce"], tau, 1),
    }


def summarize(table: list[dict[str, Any]]) -> dict[str, Any]:
    """Each mode's figures and each comparison's tests (module docstring), on the rows with the
    straggler; ``healthy``: H5 on the rows without it."""
    from analysis.stats import log_ratio_t

    ok = [r for r in table if (r.get("condition") or "straggle") == "healthy"]
    table = [r for r in table if (r.get("condition") or "straggle") == "straggle"]
    by = {m: {int(r["seed"]): r for r in table if r["mode"] == m} for m in MODES}
    tau = min((r["T"] for r in table), default=math.nan)
    m = len(COMPARISONS)
    level = 1 - ALPHA / m
    res: dict[str, Any] = {"tau": tau, "modes": {k: mode_summary(v, tau) for k, v in by.items()}}
    tests = {}
    for a, b in COMPARISONS:
        auc = log_ratio_t(
            {s: r["auc_return"] for s, r in by[a].items()},
            {s: r["auc_return"] for s, r in by[b].items()},
            level,
        )
        during = log_ratio_t(
            {s: r["ups_during"] for s, r in by[a].items()},
            {s: r["ups_during"] for s, r in by[b].items()},
        )
        tests[f"{a}-{b}"] = {
            **restricted_diff(by[a], by[b], tau, m),
            "auc_ratio": auc.estimate,
            "auc_low": auc.low,
            "auc_high": auc.high,
            "auc_p_adj": min(1.0, auc.p * m) if math.isfinite(auc.p) else math.nan,
            "ups_during_ratio": during.estimate,
        }
    res["tests"] = tests
    res["healthy"] = healthy(ok)
    return res


def planned(spec: Path = SPEC) -> int:
    """Seeds the spec plans (pairs per comparison)."""
    from mpirl.sweep import load_spec

    return len(load_spec(spec).seeds)


def healthy_markdown(h: dict[str, Any], plan: int) -> list[str]:
    """H5's table and its sentence (plan.md's rule)."""
    lines = [
        "No straggler (`healthy.toml`, H5): switch against allreduce.",
        "",
        "| mode | runs | reached | restricted mean time to target (s) | return AUC "
        "| updates | updates to target (median) | switches (mean) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for mode, s in h["modes"].items():
        if not s["n"]:
            lines.append(f"| {mode} | 0 | - | not yet run | - | - | - | - |")
            continue
        lines.append(
            f"| {mode} | {s['n']} | {s['reached']}/{s['n']} | {_f(s['rmst'])} | {_f(s['auc'])} "
            f"| {_f(s['updates'], '{:,.0f}')} | {_f(s['updates_to_target'], '{:,.0f}')} "
            f"| {_f(s['switches'])} |"
        )
    t = h["ttt"]
    lines += [
        "",
        f"Return AUC, switch / allreduce: {_f(h['auc_ratio'], '{:.3f}')} "
        f"[{_f(h['auc_low90'], '{:.3f}')}, {_f(h['auc_high90'], '{:.3f}')}] (90% t, the "
        f"equivalence test against [{MARGIN}, {1 / MARGIN:.3f}]), "
        f"[{_f(h['auc_low95'], '{:.3f}')}, {_f(h['auc_high95'], '{:.3f}')}] (95% t); "
        f"restricted time to target, switch - allreduce: {_f(t['diff'], '{:+.1f}')} s "
        f"[{_f(t.get('low', math.nan), '{:+.1f}')}, {_f(t.get('high', math.nan), '{:+.1f}')}] "
        f"(95% t), {h['n']} pairs.",
        "",
    ]
    if h["n"] < plan:
        lines.append(f"H5 interim, not decided: {h['n']} of the planned {plan} pairs.")
        return lines
    said = []
    if h["equivalent"]:
        said.append("**switch learns as allreduce does with no straggler** (return AUC "
                    f"equivalent within [{MARGIN}, {1 / MARGIN:.3f}])")  # fmt: skip
    if h["differs"]:
        way = "more" if h["auc_low95"] > 1 else "less"
        said.append(f"**switch's return AUC differs from allreduce's** ({way})")
    if not said:
        said.append(f"inconclusive at n = {h['n']}: neither equivalence nor a difference shown")
    lines.append("H5, decided at the planned pairs: " + "; ".join(said) + ".")
    return lines


def _f(x: float, fmt: str = "{:.1f}") -> str:
    return fmt.format(x) if math.isfinite(x) else "-"


def _modes_table(res: dict[str, Any]) -> list[str]:
    lines = [
        "| mode | runs | reached | restricted mean time to target (s) | median (s) "
        "| return AUC | updates | updates to target (median) "
        "| updates/s before / during / after the window | gradient lag (updates) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for mode, s in res["modes"].items():
        if not s["n"]:
            lines.append(f"| {mode} | 0 | - | not yet run | - | - | - | - | - | - |")
            continue
        med = _f(s["median"]) if math.isfinite(s["median"]) else f"> {res['tau']:.0f}"
        ups = " / ".join(_f(s[f"ups_{p}"], "{:,.0f}") for p in PHASES)
        lines.append(
            f"| {mode} | {s['n']} | {s['reached']}/{s['n']} | {_f(s['rmst'])} | {med} "
            f"| {_f(s['auc'])} | {_f(s['updates'], '{:,.0f}')} "
            f"| {_f(s['updates_to_target'], '{:,.0f}')} | {ups} | {_f(s['lag'], '{:.2f}')} |"
        )
    return lines


def _tests_table(res: dict[str, Any], plan: int) -> list[str]:
    pct = 100 * (1 - ALPHA / len(COMPARISONS))
    lines = [
        f"| comparison | pairs | restricted time to target, difference (s) [{pct:.2f}% t] "
        f"| p x {len(COMPARISONS)} | call | return AUC ratio [{pct:.2f}% t] | p x "
        f"{len(COMPARISONS)} | updates/s during the window, ratio |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, t in res["tests"].items():
        a, b = name.split("-")
        call = t["call"] if t["n"] >= plan else f"interim ({t['n']} of {plan} pairs)"
        lines.append(
            f"| {a} - {b} | {t['n']} of {plan} | {_f(t['diff'], '{:+.1f}')} "
            f"[{_f(t['low'], '{:+.1f}')}, {_f(t['high'], '{:+.1f}')}] "
            f"| {_f(t['p_adj'], '{:.3g}')} | {call} "
            f"| {_f(t['auc_ratio'], '{:.3g}')} [{_f(t['auc_low'], '{:.3g}')}, "
            f"{_f(t['auc_high'], '{:.3g}')}] | {_f(t['auc_p_adj'], '{:.3g}')} "
            f"| {_f(t['ups_during_ratio'], '{:.2f}')} |"
        )
    return lines


def verdict(res: dict[str, Any], plan: int) -> str:
    """The sentence under the tables: interim until every comparison has its planned pairs."""
    tests = res["tests"]
    short = [k for k, t in tests.items() if t["n"] < plan]
    if short:
        return (
            f"Interim, not decided: {', '.join(k.replace('-', ' - ') for k in short)} "
            f"{'has' if len(short) == 1 else 'have'} fewer than the planned {plan} pairs."
        )
    said = []
    for k, t in tests.items():
        a, b = k.split("-")
        if t["call"] == "sooner":
            said.append(f"**{a} reaches the target sooner than {b}** ({-t['diff']:.1f} s)")
        elif t["call"] == "later":
            said.append(f"**{a} reaches the target later than {b}** ({t['diff']:.1f} s)")
        else:
            said.append(f"{a} against {b}: no difference shown")
    return "Decided at the planned pairs: " + "; ".join(said) + "."


def markdown(res: dict[str, Any], plan: int, plan_healthy: int | None = None) -> str:
    """The generated section: the modes, the tests and the verdict; then H5."""
    head = (
        f"Censored at tau = {_f(res['tau'], '{:.0f}')} s (the shortest run); the straggler's "
        "window on the lead's clock, per run, is in the rows CSV."
    )
    h = planned(HEALTHY) if plan_healthy is None else plan_healthy
    return "\n".join(
        [
            head,
            "",
            *_modes_table(res),
            "",
            *_tests_table(res, plan),
            "",
            verdict(res, plan),
            "",
            *healthy_markdown(res["healthy"], h),
        ]
    ).rstrip()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("root", help="the sweep's folder (runs/learner-group), or a rows CSV")
    ap.add_argument("--json", default=None, help="write the summary here")
    ap.add_argument("--csv", default=None, help="merge the per-run rows into this CSV")
    ap.add_argument("--update", default=None, help="rewrite this page's generated section")
    ap.add_argument("--check", default=None, help="exit 1 if this page's section differs")
    a = ap.parse_args(argv)
    src = Path(a.root)
    table = read_rows(src) if src.suffix == ".csv" else rows(src)
    if a.csv:
        write_rows(Path(a.csv), table)
    res = summarize(table)
    text = markdown(res, planned())
    print(text)
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1, default=str))
    from analysis.verdict import update_or_check

    for page, write in ((a.update, True), (a.check, False)):
        update_or_check(page, "learner_group", text, str(src), write)


if __name__ == "__main__":
    main()
