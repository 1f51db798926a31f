"""Generate docs/results.md's result sections from committed per-run data (no HDF5, no MPI).

    python -m analysis.verdict            # rewrite the generated sections of docs/results.md
    python -m analysis.verdict --check    # exit 1 if docs/results.md is not what the data give

Each generated section sits between ``<!-- BEGIN generated: NAME -->`` and
``<!-- END generated: NAME -->``; everything else on the page is written by hand. The sections:

``equal_time``
    The equal-wall-time design from ``docs/results/data/equal-time/`` (`analysis.export`
    writes it, the sweep after every run): the family F with Holm's decisions, the matched
    control, each cell's achieved rates (marked when off by more than 10%), ratios with
    t-intervals, IQM and probability of improvement, time to target (restricted mean, paired t),
    what the learner trains on, and the crossover map (`analysis.equal_time`); the figures (per
    cell, and a forest plot per family: ``forest-F.png``, ``forest-U.png``) go to
    ``docs/results/equal-time/``.

``placement3``
    Stage 1 of experiments/placement-3/plan.md (three placements) from
    ``docs/results/data/placement-3/`` (`analysis.placement3`, the pre-registered analysis): the
    headline table (which placement to use per cell, with its evidence, and what
    ``--replay-at auto`` chose), the three families' decisions with their simultaneous
    intervals, and each cell's secondary outcomes.

``reanalysis``
    The withdrawn fixed-update design re-analysed from its committed per-run rows
    (``docs/results/appendix/fixed-updates/paper-cells.csv`` and ``.../minatar/paper-cells.csv``,
    which `analysis.paper` wrote from the runs' HDF5) with the statistics of the equal-wall-time
    plan (`analysis.stats`): t-intervals on paired log
    ratios, Holm over the old deciding cells x the two figures in the paper's units (training
    loss, |td| on arrival), the regression of the reference loss on wall time and placement that
    shows the confound, and time to target as survival on the horizon both placements ran.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

from analysis.stats import (
    DECIDING,
    PAPER_LOSS,
    PAPER_PRIORITY,
    TimeDiff,
    figure_outcome,
    holm,
    ratio,
    rmst_cell,
)
from analysis.tables import brief, by_cell, read_rows

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "docs" / "results.md"
FIXED = ROOT / "docs" / "results" / "appendix" / "fixed-updates"


def fixed_update_rows() -> list[dict]:
    """The fixed-update runs' rows, each with its ``env``; a MinAtar cell is named with it."""
    rows = []
    for path, env in (
        (FIXED / "paper-cells.csv", "CartPole-v1"),
        (FIXED / "minatar" / "paper-cells.csv", "MinAtar/Breakout"),
    ):
        for row in read_rows(path):
            row["env"] = env
            if env != "CartPole-v1":
                row["cell"] = f"{env} {row['cell']}"
            rows.append(row)
    return rows


def delivered(cell: dict[str, dict]) -> float:
    return float(np.median([r["delivered_fraction"] for r in cell["learner"].values()]))


# --- the confound --------------------------------------------------------------------------------


def confound(rows: list[dict]) -> dict[str, float]:
    """OLS of log reference loss on log wall time and placement over the CartPole runs."""
    rs = [r for r in rows if r["env"] == "CartPole-v1" and r["ref_loss"] > 0]
    y = np.log([r["ref_loss"] for r in rs])
    lw = np.log([r["wall_s"] for r in rs])
    prop = np.array([r["replay_at"] == "buffer" for r in rs], dtype=float)
    x = np.column_stack([np.ones_like(y), lw, prop])
    beta, *_ = np.linalg.lstsq(x, y, rcond=None)
    resid = y - x @ beta
    s2 = float(resid @ resid) / (len(y) - x.shape[1])
    se = np.sqrt(np.diag(s2 * np.linalg.inv(x.T @ x)))
    return {
        "n": len(y),
        "corr": float(np.corrcoef(lw, y)[0, 1]),
        "wall": float(beta[1]),
        "wall_se": float(se[1]),
        "placement": float(beta[2]),
        "placement_se": float(se[2]),
    }


# --- time to target on the common horizon --------------------------------------------------------


def survival(cell: dict[str, dict]) -> TimeDiff | None:
    """Restricted mean time to target up to the shortest run's wall time, paired by seed (a
    blank time: not reached)."""
    return rmst_cell(cell, "wall_s", lambda r: math.isfinite(r["time_to_target_s"]))


# --- the section ---------------------------------------------------------------------------------

FIGURES = (
    ("training loss (importance-weighted)", "train_loss", PAPER_LOSS),
    ("transferred priority, \\|td\\| on arrival", "arrival_td", PAPER_PRIORITY),
)


def reanalysis() -> str:
    rows = fixed_update_rows()
    cs = by_cell(rows)
    deciding = [c for c in cs if delivered(cs[c]) < DECIDING]
    tests = [
        (c, label, key, paper, ratio(cs[c], key)) for c in deciding for label, key, paper in FIGURES
    ]
    adj = holm([t[4].p for t in tests])
    m = len(tests)
    out = _cell_table(cs)
    out += [
        "",
        f"**The old deciding cells under the new rule** (the cells where the existing "
        f"placement delivered less than 90% of production; Holm over these {m} tests, "
        f"family-wise alpha 0.05; the simultaneous intervals are at level 1 - 0.05/{m}):",
        "",
        "| cell | figure (paper) | ratio [95% t-interval] | p | Holm p | simultaneous "
        "interval | outcome |",
        "|---|---|---|---|---|---|---|",
    ]
    outcomes = []
    for (c, label, _key, paper, r), p_adj in zip(tests, adj, strict=True):
        lo, hi = r.interval(1 - 0.05 / m)
        o = figure_outcome(r, p_adj, paper, m)
        outcomes.append((c, label, o))
        out.append(
            f"| {c} | {label} ({paper:g}) | {r.text()} | {brief(r.p, 2)} | {brief(p_adj, 2)} "
            f"| [{brief(lo)}, {brief(hi)}] | {o} |"
        )
    out += ["", _verdict_sentence(outcomes), ""]
    out += _confound_text(confound(rows))
    out += _survival_table(cs)
    return "\n".join(out)


def _cell_table(cs: dict) -> list[str]:
    out = [
        "Proposed / existing per cell, ratio of geometric means over paired seeds with its "
        "95% t-interval on log ratios (n pairs). The wall-time ratio shows the confound: "
        "every run had 10,000 updates, not the same time. The training loss here is the "
        "IS-weighted one: the unweighted TD loss, primary in the equal-wall-time design, was "
        "not logged in these runs.",
        "",
        "| cell | n | existing delivers | wall time | training loss | \\|td\\| on arrival "
        "(paper's unit) | p^0.6 held (mpirl's old unit) | reference loss |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for c, cell in cs.items():
        rs = {
            k: ratio(cell, k)
            for k in ("wall_s", "train_loss", "arrival_td", "prio_held", "ref_loss")
        }
        out.append(
            f"| {c} | {rs['train_loss'].n} | {delivered(cell):.0%} | "
            + " | ".join(rs[k].text() for k in rs)
            + " |"
        )
    return out


def _verdict_sentence(outcomes: list[tuple[str, str, str]]) -> str:
    kinds = [o.split(" at n")[0].split(",")[0] for _, _, o in outcomes]
    count = {k: kinds.count(k) for k in dict.fromkeys(kinds)}
    said = "; ".join(f"{n} {k}" for k, n in count.items())
    against = [f"{label} in {c}" for c, label, o in outcomes if o == "opposite direction"]
    matches = [f"{label} in {c}" for c, label, o in outcomes if o == "matches the paper"]
    text = (
        f"**Of the {len(outcomes)} deciding tests re-analysed: {said}.** None of this is "
        f"the plan's verdict: run length differed with the placement in these cells."
    )
    if matches:
        text += f" Matching the paper: {', '.join(matches)}."
    if against:
        text += f" Against the paper's direction: {', '.join(against)}."
    return text


def _confound_text(c: dict) -> list[str]:
    text = (
        "**The confound.** Over the {n} CartPole runs, log reference loss correlates "
        "{corr:.2f} with log wall time. Regressed on both, the wall-time slope is "
        "{wall:.2f} +- {wall_se:.2f} (SE) and the placement term (proposed) {placement:+.3f} "
        "+- {placement_se:.3f}".format(**c)
    )
    if abs(c["placement"]) < 2 * c["placement_se"]:
        text += (
            ": once run length is accounted for, placement shows no effect on the reference "
            "loss, so the withdrawn verdict's reference-loss ratios measured run length."
        )
    else:
        text += ": placement has an effect on the reference loss beyond run length."
    return [text, ""]


def _survival_table(cs: dict) -> list[str]:
    out = [
        "**Time to eval 475 on the horizon both placements ran** (CartPole): each seed is "
        "censored at tau, the shortest run of its cell, in both placements, so neither "
        "placement is credited with the other's longer run. Restricted mean time to target up "
        "to tau per placement over the seed pairs, their difference proposed - existing with "
        "its 95% t-interval and the paired t p (`analysis.stats.rmst_paired`: the "
        "interval excludes 0 exactly when p < 0.05):",
        "",
        "| cell | tau | reached (existing / proposed) | RMST existing | RMST proposed | "
        "difference [95% CI] | paired t p |",
        "|---|---|---|---|---|---|---|",
    ]
    short = []
    for c, cell in cs.items():
        s = survival(cell)
        if s is None:
            continue
        longest = max(r["wall_s"] for v in cell.values() for r in v.values())
        if s.tau < 0.5 * longest:
            short.append(f"{c} ({s.tau:.0f} of {longest:.0f} s)")
        out.append(
            f"| {c} | {s.tau:.0f} s | {s.reached_learner}/{s.n} / {s.reached_buffer}/{s.n} | "
            f"{s.rmst_learner:.1f} s | {s.rmst_buffer:.1f} s | {s.text()} | {brief(s.p, 2)} |"
        )
    if short:
        out += [
            "",
            "In " + ", ".join(short) + " one placement's runs ended before half of the "
            "other's, so those rows compare only the first tau seconds; the withdrawn "
            "crossover map compared unequal horizons there.",
        ]
    return out


DATA = ROOT / "docs" / "results" / "data" / "equal-time"
FIGURE_DIR = ROOT / "docs" / "results" / "equal-time"


def equal_time() -> str:
    from analysis import equal_time as E

    body = E.section(DATA)
    if (DATA / "runs.csv").exists():
        cells = E.plan_cells(E.read(DATA)[0])
        body += "\n\n" + "\n".join(f"![{c}](results/equal-time/{E.slug(c)}.png)" for c in cells)
        body += "\n\nForest plots, one row per cell and outcome (point, 95% interval, the line "
        body += "at no effect, the paper's value where it gives one):\n\n"
        body += "![family F](results/equal-time/forest-F.png)\n![family U]"
        body += "(results/equal-time/forest-U.png)"
    return body


def pilot() -> str:
    from analysis import equal_time as E

    return E.pilot_section(ROOT / "docs" / "results" / "data" / "equal-time-pilot")


def placement3() -> str:
    from analysis import placement3 as P3

    return P3.stage1_section()


SECTIONS: dict[str, Callable[[], str]] = {
    "equal_time": equal_time,
    "pilot": pilot,
    "reanalysis": reanalysis,
    "placement3": placement3,
}


def replace_section(page: str, name: str, body: str, where: str = "docs/results.md") -> str:
    """``page`` with the generated section ``name`` (between its BEGIN/END markers) set to
    ``body``; a page without the markers is an error naming them."""
    pat = re.compile(
        rf"(<!-- BEGIN generated: {name} -->\n)(?:.*?\n)?(<!-- END generated: {name} -->)",
        re.S,
    )
    if not pat.search(page):
        raise ValueError(f"{where} has no generated section {name!r}: add the BEGIN/END markers")
    return pat.sub(lambda m: m.group(1) + body + "\n" + m.group(2), page)


def update_or_check(page: str | None, name: str, body: str, src: str, write: bool) -> None:
    """An experiment script's ``--update PAGE`` (``write``) or ``--check PAGE``: set the
    generated section ``name`` of ``page`` to ``body``, or exit naming the fix when it
    differs.  ``page`` None: nothing to do."""
    if not page:
        return
    old = Path(page).read_text()
    new = replace_section(old, name, body, where=page)
    if write:
        Path(page).write_text(new)
    elif new != old:
        sys.exit(f"{page} is not what {src} gives: rerun with --update {page}")


def render(page: str) -> str:
    """``page`` with every generated section replaced by what the data give now."""
    for name, make in SECTIONS.items():
        page = replace_section(page, name, make())
    return page


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m analysis.verdict",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--page", type=Path, default=RESULTS)
    ap.add_argument(
        "--check", action="store_true", help="exit 1 when the page differs from the regenerated one"
    )
    ap.add_argument("--no-plots", action="store_true", help="do not rewrite the figures")
    a = ap.parse_args(argv)
    page = a.page.read_text()
    new = render(page)
    if a.check:
        if new != page:
            print(
                f"{a.page} is not what the committed data give: run python -m analysis.verdict",
                file=sys.stderr,
            )
            return 1
        return 0
    a.page.write_text(new)
    if not a.no_plots:
        from analysis import equal_time as E

        E.figures(DATA, FIGURE_DIR)
        from analysis import placement3 as P3

        P3.stage1_figures()
    return 0


if __name__ == "__main__":
    sys.exit(main())
