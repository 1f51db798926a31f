"""The equal-wall-time results of docs/results.md, from the committed per-run data only.

Input: ``docs/results/data/equal-time/runs.csv`` and ``curves.csv`` (`analysis.export`). Cells
are named by the sweep folders (``cell=A``, ``cell=B``, ``cell=C``, ``cell=M``, and the map's
``bandwidth_mbps=..., rho=...``). The rule, the family and every definition are the Plan's
(docs/results.md); `analysis.stats` holds the statistics. `section` returns the markdown and
`figures` writes the plots (Kaplan-Meier, return against time and against link MB).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import numpy as np

from analysis.plots import ForestRow, plot_forest
from analysis.stats import (
    PAPER_LOSS,
    PAPER_PRIORITY,
    LogRatio,
    TimeDiff,
    figure_outcome,
    holm,
    ratio,
    rmst_cell,
)
from analysis.tables import PAPER_TERM, brief, by_cell, read_rows

#: the family's figures: the training loss is the unweighted TD loss (primary since issue 47; the
#: IS-weighted one is secondary: its weights (p / p_min)^-beta take p_min over the whole memory,
#: so it is 0.1-8% of the unweighted loss and tracks p_min and beta, not the TD error)
PAPER = {"train_loss_unweighted": PAPER_LOSS, "prio_td_held": PAPER_PRIORITY}
FIGURE_NAMES = {
    "train_loss_unweighted": "training loss (unweighted TD)",
    "prio_td_held": "transferred priority (|td|+eps)",
}
DECIDING = ("cell=A", "cell=B", "cell=M")
#: the Plan's pairs per deciding cell (its power estimate); a family with a cell short of its
#: pairs decides nothing (interim), and its Holm correction counts the tests run so far only
PLANNED = {"cell=A": 20, "cell=B": 20, "cell=M": 10}
#: the Plan's pairs per crossover-map cell; a map cell short of them is interim in family U
PLANNED_MAP = 10
CONTROL, THINNING = "cell=C", "cell=B"
METRICS = (
    ("train_loss_unweighted", "training loss, unweighted TD (primary)"),
    ("train_loss", "training loss, IS-weighted (secondary)"),
    ("prio_td_held", "priority held, \\|td\\|+eps"),
    ("prio_held", "priority held, p^alpha"),
    ("arrival_td", "\\|td\\| on arrival"),
    ("auc_return", "return AUC over [0, T]"),
    ("final_return", "final-window return"),
    ("return_per_mb", "return AUC per link MB"),
    ("ref_loss_norm", "reference loss / mean Q^2 (secondary)"),
)
#: family U's outcomes: (key, name, the word for the better placement); time to target is tested
#: only in cells with a target (CartPole)
OUTCOMES = (
    ("auc_return", "return AUC", "higher"),
    ("time_to_target", "time to target", "sooner"),
    ("return_per_mb", "return per MB", "higher"),
)
REQUESTED_TOLERANCE = 0.10
#: a run whose last-quarter mean return exceeds its third quarter's by more than this factor is
#: "still rising" at T; a cell's curve has flattened when at most half its runs are
RISING = 1.05


def read(data: Path) -> tuple[list[dict], dict[str, dict[str, np.ndarray]]]:
    """runs.csv rows (`analysis.tables.read_rows`) and the curves by run."""
    runs = read_rows(data / "runs.csv")
    curves: dict[str, dict[str, list]] = {}
    if (data / "curves.csv").exists():
        for r in read_rows(data / "curves.csv"):
            c = curves.setdefault(r["run"], {})
            for k, v in r.items():
                if k != "run":
                    c.setdefault(k, []).append(v)
    return runs, {k: {c: np.asarray(v, float) for c, v in d.items()} for k, d in curves.items()}


def plan_cells(runs: list[dict]) -> dict[str, dict[str, dict[int, dict]]]:
    """The Plan's cells (`analysis.tables.by_cell`), deciding cells and C first; cell C's buffer
    arm is cell B's."""
    out = by_cell(runs)
    if CONTROL in out and THINNING in out:
        out[CONTROL]["buffer"] = out[THINNING]["buffer"]
    return dict(sorted(out.items(), key=lambda kv: (kv[0] not in DECIDING + (CONTROL,), kv[0])))


def achieved(cell: dict, arm: str) -> dict[str, float]:
    rows = list(cell[arm].values())
    out = {}
    for k in ("P", "U", "rho", "delivered_fraction", "T", "load_max", "P_requested", "U_requested"):
        x = np.array([r[k] for r in rows], float)
        out[k] = float(np.median(x[np.isfinite(x)])) if np.isfinite(x).any() else math.nan
    return out


def marks(cell: dict) -> list[str]:
    """The Plan's check: achieved P and U within 10% of what the runs requested (their rows'
    ``P_requested`` / ``U_requested``), in the median run of each placement."""
    out = []
    for arm in ("learner", "buffer"):
        a = achieved(cell, arm)
        for k in ("P", "U"):
            want = a[f"{k}_requested"]
            if (
                math.isfinite(want)
                and math.isfinite(a[k])
                and abs(a[k] / want - 1) > REQUESTED_TOLERANCE
            ):
                out.append(f"{PAPER_TERM[arm]} {k} {a[k]:.4g} against {want:.4g}")
    return out


def family_tests(cells: dict) -> list[tuple[str, str, LogRatio, float, str]]:
    """The confirmatory family F: deciding cells x the two figures, Holm-adjusted."""
    tests = [(c, k, ratio(cells[c], k)) for c in DECIDING if c in cells for k in PAPER]
    adj = holm([r.p for _, _, r in tests])
    m = len(tests)
    if not complete(cells):
        short = ", ".join(f"{c} {pairs(cells, c)} of {PLANNED[c]}" for c in DECIDING)
        return [
            (c, k, r, p, f"interim, not decided (pairs: {short})")
            for (c, k, r), p in zip(tests, adj, strict=True)
        ]
    return [
        (c, k, r, p, figure_outcome(r, p, PAPER[k], m))
        for (c, k, r), p in zip(tests, adj, strict=True)
    ]


def pairs(cells: dict, c: str) -> int:
    """Seeds of cell ``c`` run in both placements (0 when the cell has no data)."""
    return seed_pairs(cells.get(c, {}))


def seed_pairs(cell: dict) -> int:
    """Seeds of one cell run in both placements."""
    return len(set(cell.get("buffer", {})) & set(cell.get("learner", {})))


def complete(cells: dict) -> bool:
    """Whether every deciding cell has the Plan's pairs: the family F may decide."""
    return all(pairs(cells, c) >= PLANNED[c] for c in DECIDING)


def outcome_tests(cells: dict) -> dict[tuple[str, str], tuple[LogRatio | TimeDiff, float]]:
    """Family U, as the Plan names it: every cell but C x (return AUC, time to target where the
    cell has a target, return per MB), Holm-adjusted over all of them."""
    tests: dict[tuple[str, str], LogRatio | TimeDiff] = {}
    for c in cells:
        if c == CONTROL:
            continue
        for k, _, _ in OUTCOMES:
            if k != "time_to_target":
                tests[(c, k)] = ratio(cells[c], k)
            elif (td := _km(cells[c])) is not None:
                tests[(c, k)] = td
    adj = holm([r.p for r in tests.values()])
    return {key: (r, p) for (key, r), p in zip(tests.items(), adj, strict=True)}


def favours_proposed(r: LogRatio | TimeDiff) -> bool:
    """The proposed placement did better: a ratio above 1, or a shorter time to target."""
    return r.estimate < 0 if isinstance(r, TimeDiff) else r.estimate > 1


def iqm_and_improvement(cell: dict, key: str) -> tuple[float, float, float]:
    """Interquartile means per placement and P(proposed > existing) over seed pairs."""
    from scipy import stats

    p = [r[key] for r in cell["buffer"].values() if math.isfinite(r[key])]
    e = [r[key] for r in cell["learner"].values() if math.isfinite(r[key])]
    if not p or not e:
        return math.nan, math.nan, math.nan
    seeds = set(cell["buffer"]) & set(cell["learner"])
    wins = [np.sign(cell["buffer"][s][key] - cell["learner"][s][key]) for s in seeds]
    prob = (sum(w > 0 for w in wins) + 0.5 * sum(w == 0 for w in wins)) / len(wins)
    return float(stats.trim_mean(e, 0.25)), float(stats.trim_mean(p, 0.25)), float(prob)


# --- the markdown --------------------------------------------------------------------------------


def section(data: Path) -> str:
    """docs/results.md's equal-wall-time results (module docstring)."""
    if not (data / "runs.csv").exists():
        try:
            shown = data.resolve().relative_to(Path(__file__).resolve().parents[1]).as_posix()
        except ValueError:
            shown = data.name
        return (
            f"No run of the equal-wall-time design has been committed yet "
            f"(`{shown}/runs.csv` does not exist)."
        )
    runs, curves = read(data)
    cells = plan_cells(runs)
    fam = family_tests(cells)
    out = [_verdict(cells, fam), ""]
    out += _family_table(fam)
    out += _control(cells)
    out += _trained_on(cells)
    for c, cell in cells.items():
        out += _cell_block(c, cell, curves)
    out += _map(cells)
    return "\n".join(out).rstrip()


def _verdict(cells: dict, fam: list) -> str:
    n = {c: pairs(cells, c) for c in cells}
    missing = [c for c in DECIDING if c not in cells]
    parts = []
    for key, name in FIGURE_NAMES.items():
        said = [f"{o} in {c} ({r.text()}, n = {r.n})" for c, k, r, _, o in fam if k == key]
        a = next((o for c, k, _, _, o in fam if k == key and c == "cell=A"), None)
        head = (
            "not decided yet (interim: the deciding cells do not all have their planned pairs)"
            if a and a.startswith("interim")
            else "reproduced"
            if a == "matches the paper"
            else f"not reproduced ({a})"
            if a
            else "not yet tested in cell A"
        )
        parts.append(
            f"**{name} (paper {PAPER[key]:g}x): {head}.** Per deciding cell: "
            + ("; ".join(said) or "none run")
            + "."
            + _paper_value_line(fam, key)
        )
    text = " ".join(parts)
    if missing:
        text += (
            " Deciding cells without data yet: "
            + ", ".join(missing)
            + "; until they are run the family is smaller and the verdict is partial."
        )
    text += " Pairs per cell: " + ", ".join(f"{c} {k}" for c, k in n.items()) + "."
    return text


def _paper_value_line(fam: list, key: str) -> str:
    """Descriptive, outside the rule: the cells whose simultaneous interval excludes the
    paper's value (an "inconclusive" cell can still rule out the paper's size of effect)."""
    level = 1 - 0.05 / len(fam)
    ran = [(c, r.interval(level)) for c, k, r, _, _ in fam if k == key]
    out = [c for c, (lo, hi) in ran if math.isfinite(lo) and not lo <= PAPER[key] <= hi]
    if not ran or not out:
        return ""
    return (
        f" The paper's {PAPER[key]:g}x lies outside the simultaneous interval in "
        f"{len(out)} of {len(ran)} cells ({', '.join(out)}; descriptive, not part of the rule)."
    )


def _family_table(fam: list) -> list[str]:
    m = len(fam)
    out = [
        f"Confirmatory family F: {m} tests, Holm at family-wise alpha 0.05; simultaneous "
        f"intervals at level 1 - 0.05/{m}.",
        "",
        "| cell | figure (paper) | ratio [95% t-interval] | n | p | Holm p | simultaneous "
        "interval | outcome |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for c, k, r, p, o in fam:
        lo, hi = r.interval(1 - 0.05 / max(m, 1))
        out.append(
            f"| {c} | {FIGURE_NAMES[k].replace('|', chr(92) + '|')} ({PAPER[k]:g}) | "
            f"{r.text()} | {r.n} | {brief(r.p, 2)} | {brief(p, 2)} | [{brief(lo)}, {brief(hi)}] | "
            f"{o} |"
        )
    return out + [""]


def _control(cells: dict) -> list[str]:
    """Cell B against cell C in both readings of the loss; the rule reads the primary
    (unweighted TD) one, the IS-weighted one is shown beside it. The IS-weighted one depends on
    beta, which anneals with learner updates (``beta_steps``), and on p_min over the whole memory;
    C's existing arm makes fewer updates than B's proposed arm, so its weights use a smaller beta.
    The unweighted loss has neither."""
    if CONTROL not in cells or THINNING not in cells:
        return ["The replay-ratio matched control (cell C) has no data yet.", ""]
    parts, in_c = [], []
    consistent: bool | None = None
    for key, name in (("train_loss_unweighted", "unweighted TD"), ("train_loss", "IS-weighted")):
        b, c = ratio(cells[THINNING], key), ratio(cells[CONTROL], key)
        if not (b.n and c.n):
            parts.append(f"{name} not logged in these runs")
            in_c.append(0)
            continue
        parts.append(
            f"{name} {b.text()} in cell B (unequal replay per delivered transition), "
            f"{c.text()} in cell C (equal)"
        )
        if key == "train_loss_unweighted":  # the rule reads the primary, unweighted loss
            consistent = b.high < 1 and c.low <= 1 <= c.high
        in_c.append(-1 if c.high < 1 else 1 if c.low > 1 else 0)
    out = [
        "**Matched control.** Training loss, proposed / existing: "
        + "; ".join(parts)
        + ". "
        + (
            "The rule reads the unweighted loss, not logged in these runs: no reading."
            if consistent is None
            else "The data are consistent with a replay-ratio effect."
            if consistent
            else "The data do not show that the loss difference is a replay-ratio effect."
        )
    ]
    if in_c[0] * in_c[1] < 0:
        u_c = achieved(cells[CONTROL], "learner")["U"]
        u_b = achieved(cells[THINNING], "buffer")["U"]
        out.append(
            "In cell C the two readings point in opposite directions. beta anneals with learner "
            f"updates, and C's existing arm makes {u_c / u_b:.2f}x the updates of its proposed "
            "arm, so the two arms weight their losses with different beta; the unweighted loss "
            "compares them without it."
        )
    return [" ".join(out), ""]


QUARTERS = (1, 2, 3, 4)


def within_null(cell: dict, arm: str, k: int, null: str = "null_td") -> float:
    """Geometric mean over the placement's runs of trained |td| / null |td| in quarter ``k``
    (``null``: ``null_td``, what arrived; ``uniform_td``, what a uniform draw from the same
    memory would have met); NaN when no run has both (not logged in that placement or run)."""
    x = np.array(
        [
            r.get(f"batch_td_q{k}", math.nan) / r.get(f"{null}_q{k}", math.nan)
            for r in cell[arm].values()
        ],
        float,
    )
    x = x[np.isfinite(x) & (x > 0)]
    return float(np.exp(np.mean(np.log(x)))) if x.size else math.nan


def _maybe(key: str) -> Callable[[dict], float]:
    """A row's ``key``, NaN in rows exported before the column existed."""
    return lambda r: r.get(key, math.nan)


def _trained_on(cells: dict) -> list[str]:
    """What the learner trains on: the placement ratio of trained-batch |td| over [0, T] and by
    quarter of T (paired t, as every ratio), and within each placement trained / null by quarter
    (descriptive: what prioritized sampling adds to what arrived in, or was stored at, the
    memory). Rows exported before issue 47 have none of these columns: a line says so."""
    head = "**What the learner trains on** (descriptive, not in F or U)"
    has = [
        c
        for c, cell in cells.items()
        if c != CONTROL and seed_pairs(cell) and ratio(cell, _maybe("batch_td")).n
    ]
    if not has:
        return [
            f"{head}: the \\|td\\| of trained batches (`/updates/td_abs_mean`) is not logged in "
            "these runs' rows (they were exported before `batch_td` and `null_td` existed; the "
            "HDF5 files are not committed), so the placement ratio on what the learner trains "
            "on cannot be shown yet; `python -m analysis.export` writes it for new runs.",
            "",
        ]
    out = [
        f"{head}: trained-batch \\|td\\|, proposed / existing, over [0, T] and by quarter of T "
        "(paired t-intervals); beside it, within each placement, trained / arrived (existing: "
        "\\|td\\| on arrival of what was forwarded into the learner's memory) and trained / "
        "uniform (each batch's \\|td\\| weighted by 1 / what it was drawn in proportion to: "
        "what a uniform draw from the same memory would have met, the same figure in both), "
        "geometric mean over runs, Q1 to Q4. A ratio above 1 within a placement is what "
        "prioritized sampling concentrates, which the transferred-priority figure of F mixes "
        "with the placement.",
        "",
        "| cell | n | [0, T] | Q1 | Q2 | Q3 | Q4 | existing: trained / arrived | existing: "
        "trained / uniform | proposed: trained / uniform |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in has:
        cell = cells[c]
        rs = [ratio(cell, _maybe(f"batch_td{q}")) for q in ("", *(f"_q{k}" for k in QUARTERS))]
        nulls = []
        for arm, null in (
            ("learner", "null_td"),
            ("learner", "uniform_td"),
            ("buffer", "uniform_td"),
        ):
            q = [within_null(cell, arm, k, null) for k in QUARTERS]
            nulls.append(
                ", ".join(brief(v) for v in q)
                if any(math.isfinite(v) for v in q)
                else "not logged in these runs"
            )
        out.append(
            f"| {c} | {rs[0].n} | "
            + " | ".join(r.text() for r in rs)
            + " | "
            + " | ".join(nulls)
            + " |"
        )
    return out + [""]


def rising(cell: dict, curves: dict, arm: str) -> tuple[float, int, int]:
    """Whether the return curve had flattened by T, per run: g = the mean return over the last
    quarter [0.75 T, T] / that over the third quarter [0.5 T, 0.75 T) (the held evaluation on
    the common grid). Returns (median g, runs with g > RISING, runs with a curve)."""
    g = []
    for r in cell[arm].values():
        cv = curves.get(r["run"])
        if cv is None:
            continue
        t, ret, T = cv["t"], cv["return"], r["T"]
        late, mid = ret[(t >= 0.75 * T) & (t <= T)], ret[(t >= 0.5 * T) & (t < 0.75 * T)]
        late, mid = late[np.isfinite(late)], mid[np.isfinite(mid)]
        if late.size and mid.size and mid.mean() > 0:
            g.append(late.mean() / mid.mean())
    if not g:
        return math.nan, 0, 0
    return float(np.median(g)), int(np.sum(np.asarray(g) > RISING)), len(g)


def _rising_line(cell: dict, curves: dict) -> list[str]:
    (g_e, up_e, n_e), (g_p, up_p, n_p) = (rising(cell, curves, a) for a in ("learner", "buffer"))
    if not n_e and not n_p:
        return []
    flat = up_e <= n_e / 2 and up_p <= n_p / 2
    return [
        f"Return curve at T (mean over [0.75 T, T] / mean over [0.5 T, 0.75 T), median run): "
        f"existing {_x(g_e)}, proposed {_x(g_p)}; still rising by more than "
        f"{100 * (RISING - 1):.0f}% in {up_e}/{n_e} and {up_p}/{n_p} runs: the curve "
        + ("had flattened by T." if flat else "had not flattened by T.")
    ]


def _x(g: float) -> str:
    return f"{brief(g)}x" if math.isfinite(g) else "no runs"


def _cell_block(c: str, cell: dict, curves: dict) -> list[str]:
    a_e, a_p = achieved(cell, "learner"), achieved(cell, "buffer")
    out = [
        f"#### {c}",
        "",
        f"T {a_e['T']:.0f} s. Achieved (median run), existing / proposed: P "
        f"{brief(a_e['P'])} / {brief(a_p['P'])} env steps/s, U {brief(a_e['U'])} / "
        f"{brief(a_p['U'])} updates/s, rho {brief(a_e['rho'])} / {brief(a_p['rho'])}; existing "
        f"delivered {brief(a_e['delivered_fraction'])} of production; load average at most "
        f"{brief(max(a_e['load_max'], a_p['load_max']), 2)}.",
    ]
    flagged = marks(cell)
    if flagged:
        out.append(
            "**Marked: achieved rates miss the requested ones by more than 10%:** "
            + "; ".join(flagged)
            + "."
        )
    if not seed_pairs(cell):  # one placement run so far
        return [*out, "", "No seed has run in both placements yet: no ratios.", ""]
    out += ["", "| metric | proposed / existing [95% t-interval] | n | p |", "|---|---|---|---|"]
    absent = []
    for key, name in METRICS:
        r = ratio(cell, key)
        if r.n == 0:  # no run of the cell measured it (e.g. no reference set): a line, not a row
            absent.append(name)
            continue
        out.append(f"| {name} | {r.text()} | {r.n} | {brief(r.p, 2)} |")
    if absent:
        out += ["", f"Not measured in this cell's runs: {'; '.join(absent)}."]
    e_iqm, p_iqm, prob = iqm_and_improvement(cell, "final_return")
    out += [
        "",
        f"Final-window return, IQM: existing {brief(e_iqm)}, proposed {brief(p_iqm)}; "
        f"probability of improvement (proposed > existing over seed pairs) {brief(prob, 2)}.",
    ]
    out += _rising_line(cell, curves)
    km = _km(cell)
    if km:
        out.append(_km_line(km))
    return out + [""]


def _km_line(td: TimeDiff) -> str:
    """One pair has no spread to resample: no interval and no test, not a certainty."""
    spread = (
        f"[{td.low:+.1f}, {td.high:+.1f}] s, paired t p {brief(td.p, 2)}"
        if td.n >= 2
        else f"s (no interval, n = {td.n}), p -"
    )
    return (
        f"Time to target (censored at T): reached {td.reached_learner}/{td.n} existing, "
        f"{td.reached_buffer}/{td.n} proposed (seed pairs); restricted mean "
        f"{td.rmst_learner:.1f} s against {td.rmst_buffer:.1f} s, difference "
        f"{td.estimate:+.1f} {spread}."
    )


def _km(cell: dict) -> TimeDiff | None:
    """Time to target, restricted at the shortest run's T (`analysis.stats.rmst_cell`)."""
    return rmst_cell(cell, "T", lambda r: r["reached"] == 1)


def _map(cells: dict) -> list[str]:
    tests = outcome_tests(cells)
    if not tests:
        return []
    out = [
        "**Where should the replay memory live?** Family U: every cell x (return AUC, "
        "time to target where the cell has a target, return per link MB), Holm at 0.05 over "
        f"its {len(tests)} tests; a placement wins when its Holm-adjusted p < 0.05. Time to "
        "target is the restricted mean difference proposed - existing, its interval and p from one "
        "paired t procedure (they agree by construction).",
        "",
        "| cell | " + " | ".join(n for _, n, _ in OUTCOMES) + " |",
        "|---|" + "---|" * len(OUTCOMES),
    ]
    short = {c: pairs(cells, c) for c, _ in tests if pairs(cells, c) < planned(c)}
    if short:
        out[0] += (
            f" **Interim:** {len(short)} cell(s) do not have their planned pairs yet; their "
            "entries decide nothing, and Holm counts only the tests with a p-value so far, so "
            "the adjusted p-values of the complete cells can still rise until every cell is run."
        )
    by: dict[str, dict[str, list[str]]] = {key: {} for key, _, _ in OUTCOMES}  # who -> cells
    for c in dict.fromkeys(c for c, _ in tests):
        row = []
        for key, _, _ in OUTCOMES:
            if (c, key) not in tests:
                row.append("not tested (no target)")
                continue
            r, p = tests[(c, key)]
            if c in short:
                label, who = "interim", f"interim, n = {short[c]} of {planned(c)}"
            elif p < 0.05:
                label = "proposed" if favours_proposed(r) else "existing"
                who = f"**{label}**"
            else:
                label, who = "no difference shown", f"no difference shown at n = {r.n}"
            by[key].setdefault(label, []).append(c)
            row.append(f"{who}, {r.text()}, Holm p {brief(p, 2)}")
        out.append(f"| {c} | " + " | ".join(row) + " |")
    return [*out, "", _map_answer(cells, by, len(tests), bool(short)), ""]


def _map_answer(cells: dict, by: dict, n_tests: int, interim: bool) -> str:
    """The family-U table in one generated sentence per outcome; cells whose achieved rates
    missed the requested ones are named as marked."""
    tested = {c for v in by.values() for w in v.values() for c in w}
    marked = [c for c in cells if c in tested and marks(cells[c])]  # in the table's order
    head = (
        f"**In words (family U, {n_tests} tests; complete cells only, interim ones decide "
        "nothing):**"
        if interim
        else f"**In words (family U, {n_tests} tests, every cell complete):**"
    )
    parts = []
    for key, name, better in OUTCOMES:
        said = [
            f"{who} {better} in {len(cs)} ({'; '.join(cs)})"
            if who in ("existing", "proposed")
            else f"no difference shown in {len(cs)} ({'; '.join(cs)})"
            for who in ("existing", "proposed", "no difference shown")
            if (cs := by[key].get(who))
        ]
        parts.append(
            f"{name[0].upper()}{name[1:]}: " + ("; ".join(said) or "no complete cell yet") + "."
        )
    tail = (
        f" Marked cells (a placement missed its requested rates by more than 10%, so the cell "
        f"compares what the link allowed, not the requested rates): {'; '.join(marked)}."
        if marked
        else ""
    )
    return f"{head} " + " ".join(parts) + tail


def planned(c: str) -> int:
    """The Plan's pairs for cell ``c``: a deciding cell's, else a map cell's."""
    return PLANNED.get(c, PLANNED_MAP)


# --- the figures ---------------------------------------------------------------------------------


def slug(cell: str) -> str:
    return "".join(ch if ch.isalnum() or ch in ".-" else "-" for ch in cell).strip("-")


def figures(data: Path, out: Path) -> list[Path]:
    """Per cell: return against wall time and against cumulative link MB (median and IQR over
    seeds per placement), and the Kaplan-Meier curves of time to target; per family (F, U) a
    forest plot (`forest_figures`)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not (data / "runs.csv").exists():
        return []
    runs, curves = read(data)
    cells = plan_cells(runs)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for c, cell in cells.items():
        fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
        for arm, color in (("learner", "tab:blue"), ("buffer", "tab:orange")):
            cs = [curves[r["run"]] for r in cell[arm].values() if r["run"] in curves]
            if not cs:
                continue
            t = cs[0]["t"]
            ret = np.array([x["return"] for x in cs])
            mb = np.array([x["link_mb"] for x in cs])
            for ax, x in ((axes[0], t), (axes[1], np.nanmedian(mb, axis=0))):
                ax.plot(x, np.nanmedian(ret, axis=0), color=color, label=PAPER_TERM[arm])
                ax.fill_between(x, *np.nanpercentile(ret, [25, 75], axis=0), color=color, alpha=0.2)
            _km_plot(axes[2], list(cell[arm].values()), color, PAPER_TERM[arm])
        for ax, xl in zip(
            axes, ("wall time (s)", "link MB (median)", "wall time (s)"), strict=True
        ):
            ax.set_xlabel(xl)
        axes[0].set_ylabel("greedy return")
        axes[2].set_ylabel("not at target yet")
        axes[0].legend()
        fig.suptitle(c)
        fig.tight_layout()
        p = out / f"{slug(c)}.png"
        fig.savefig(p, dpi=90)
        plt.close(fig)
        paths.append(p)
    return paths + forest_figures(cells, out)


def forest_rows(cells: dict) -> dict[str, list[ForestRow]]:
    """The forest plot's rows of each family: F (deciding cells x the two figures, the paper's
    value marked) and U (every cell but C x its outcomes; time to target in seconds); each
    row's interval is the one its table shows (95%, paired t)."""
    fam = [
        ForestRow(f"{c}: {FIGURE_NAMES[k]}", r.estimate, r.low, r.high, PAPER[k], "ratio")
        for c, k, r, _, _ in family_tests(cells)
    ]
    names = {k: name for k, name, _ in OUTCOMES}
    u = [
        ForestRow(
            f"{c}: {names[k]}",
            r.estimate,
            r.low,
            r.high,
            None,
            "s" if isinstance(r, TimeDiff) else "ratio",
        )
        for (c, k), (r, _) in outcome_tests(cells).items()
    ]
    return {"F": fam, "U": u}


def forest_figures(cells: dict, out: Path) -> list[Path]:
    """``forest-F.png`` and ``forest-U.png`` in ``out`` (`analysis.plots.plot_forest`)."""
    titles = {
        "F": "Family F: proposed / existing per deciding cell (x: the paper's value)",
        "U": "Family U: user outcomes per cell",
    }
    return [
        plot_forest(rows, out / f"forest-{fam}.png", titles[fam])
        for fam, rows in forest_rows(cells).items()
        if rows
    ]


def _km_plot(ax, rows: list[dict], color: str, label: str) -> None:
    from lifelines import KaplanMeierFitter

    if not rows or not all(math.isfinite(r["target"]) for r in rows):
        return
    t = np.array([r["time_to_target_s"] for r in rows])
    ev = np.array([r["reached"] == 1 for r in rows])
    KaplanMeierFitter().fit(t, ev, label=label).plot_survival_function(ax=ax, color=color)


# --- cell B's pilot ------------------------------------------------------------------------------


def pilot_section(data: Path) -> str:
    """The pilot of cell B (calibration, not evidence): per bandwidth, what each placement
    achieved, and the bandwidth b* the Plan's rule picks: the existing placement delivers 40-60%
    of production while the proposed one holds its requested U within 10%."""
    if not (data / "runs.csv").exists():
        return "The pilot has not been run yet."
    runs, _ = read(data)
    rows = {}
    for r in runs:
        bw = float(r["cell"].split("bandwidth_mbps=")[1].split(",")[0])
        rows.setdefault(bw, {})[r["replay_at"]] = r
    out = [
        "| bandwidth | existing: P, U, delivered | proposed: P, U (requested) | link MB "
        "(existing / proposed) | load max |",
        "|---|---|---|---|---|",
    ]
    fits = []
    for bw in sorted(rows):
        e, p = rows[bw].get("learner"), rows[bw].get("buffer")
        if e is None or p is None:
            continue
        out.append(
            f"| {bw:g} Mb/s | {brief(e['P'])}, {brief(e['U'])}, {brief(e['delivered_fraction'])} "
            f"| {brief(p['P'])}, {brief(p['U'])} ({brief(p['U_requested'])}) | "
            f"{brief(e['link_mb'])} / {brief(p['link_mb'])} | "
            f"{brief(max(e['load_max'], p['load_max']), 2)} |"
        )
        holds = abs(p["U"] / p["U_requested"] - 1) <= REQUESTED_TOLERANCE
        if 0.4 <= e["delivered_fraction"] <= 0.6 and holds:
            fits.append((abs(e["delivered_fraction"] - 0.5), bw, e["delivered_fraction"]))
    if fits:
        _, bw, f = min(fits)
        rule = (
            f"**b\\* = {bw:g} Mb/s**: the existing placement delivered {f:.0%} of "
            f"production there and the proposed one held its U (f = {f:.3f}). Cell C's U is "
            f"f_B x 46.875 with f_B the median delivered fraction of cell B's own existing "
            f"runs (experiments/equal-time/C.toml)."
        )
    else:
        rule = (
            "**No pilot bandwidth met both conditions**; the pilot must be extended before "
            "cell B runs."
        )
    return "\n".join(out) + "\n\n" + rule
