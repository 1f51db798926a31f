"""Stage 1 of experiments/placement-3/plan.md: the pre-registered analysis of three placements.

    python -m analysis.verdict                                  # regenerates the section
    python -m analysis.placement3 --auto runs/placement-3/auto  # records auto's choices

Written and committed 2026-12-05 before any stage-1 run (the plan's rules, as code). It reads
the exported rows ``docs/results/data/placement-3/runs.csv`` (`analysis.export`, merged by the
sweep after every run) and ``auto.csv`` (what ``--replay-at auto`` chose per cell, from the auto
checks' run folders, ``--auto``), and writes docs/results.md's ``placement3`` section.

**Cells.** Deciding: ``cell=A``, ``cell=B``, ``cell=M`` (20 seeds each); the map: bandwidth
100, 5, 1.25 Mb/s x rho 0.25, 1, 4 (10 seeds each). Arms: ``learner``, ``buffer``, ``thinned``,
paired by seed. A cell is **complete** when every arm has its planned seeds; a family decides
only when all its cells are complete (until then the section is **interim** and says so; the
intervals shown are already the final level's).

**Families** (plan.md "Stage 1"), thinned against each other arm, paired by seed:

- *not worse* (m = 48 = 12 cells x 2 arms x 2 outcomes): the return AUC ratio
  thinned / other (paired t on log ratios) with margin 0.9, and time to target as the
  difference of restricted times (thinned - other, paired t on per-seed times each censored at
  tau = the cell's planned T, its spec's ``max_seconds``; `analysis.stats.rmst_paired`) with
  margin +0.1 T. A cell is **not worse** when its two AUC tests and every informative time
  test clear. A time test is **uninformative** when the env has no target (MinAtar Breakout:
  cell M is judged on AUC alone, its m unchanged) or when no run of either arm reached the
  target by T (every restricted time is T: a difference of exactly 0 by construction); it
  neither clears nor misses and its p is left out of Holm.
- *no more bytes* (m = 12, one claim per cell): link MB thinned / each of learner and buffer,
  margin 1.05 from above ("at or below"). Both must clear: that implies the plan's "against the
  cheaper arm" without choosing the cheaper one from the data, and as an intersection-union
  test each test at the plan's level keeps the claim's level.
- *beats both* (m = 8, the capped cells 1.25 and 5 Mb/s x rho 1 and 4): the AUC ratio against
  both, margin 1.

Seeds present in one arm only, or whose ratio has a value <= 0 (an AUC of 0), are left out of
that ratio and counted as unpaired beside it. A run that stopped before 95% of its cell's T is
listed; its time to target counts as not reached by T.

**Decisions and intervals are one procedure.** Every test is one-sided against its margin; its
interval is the two-sided t-interval at 1 - 0.05/m (the plan's simultaneous level), whose end
on the margin's side is the one-sided test at 0.025/m (Bonferroni). A test **clears** (the
claim is made) when that end is past the margin, and is a **clear miss** when the whole
interval lies on the wrong side of it. Holm's adjusted p of the same one-sided p-values is
reported beside each test (at the one-sided 0.025; for bytes over the 12 cells' claims, each the
larger p of its two tests): Holm rejects every test that clears, and a test that Holm rejects
but that does not clear is marked "Holm only" and claims nothing, so no decision disagrees with
the interval printed next to it. This reads plan.md's "Holm within each" together with its
claims' wording ("the simultaneous lower end is above 0.9"): the interval decides, which is the
more conservative of the two. A test without an interval (n < 2) is "not shown"; Holm counts
it as p = 1 (its m stays the planned family's while cells are still running).

**Headline** (where the replay memory should live, per cell): thinned where it beats both, or
where it is not worse than both and not a clear miss on bytes; otherwise the better of learner
and buffer by the paired AUC ratio when its 95% interval excludes 1 (descriptive: that
comparison is in no family), and where it does not, "either", naming the one with fewer median
link MB. Auto's choice (``auto.csv``) is shown beside it: the same, one of "either", or
different.

**Secondary, reported, not tested**: per arm, the median return AUC, the final-window return
IQM (mean of the middle half of the seeds' ``final_return``), restricted time to target and
how many reached, median link MB, delivered fraction, updates/s, the unweighted TD loss (the
comparable loss), the IS-weighted loss (a normaliser, docs/results.md), the trained batch's
|td| over the within-placement null by quarter (learner and thinned: the buffer logs no null),
and thinned's kept fraction and budget.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from analysis.stats import LogRatio, TimeDiff, holm, log_ratio_t, rmst_paired
from analysis.tables import brief, by_cell, md_table, read_rows

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "docs" / "results" / "data" / "placement-3"
AUTO_FIELDS = ("cell", "replay_at", "confidence", "why", "run")

NEW, OTHERS = "thinned", ("learner", "buffer")
ARMS = (*OTHERS, NEW)
DECIDING = ("cell=A", "cell=B", "cell=M")
BANDWIDTHS, RHOS = ("100", "5", "1.25"), ("0.25", "1", "4")
MAP = tuple(f"bandwidth_mbps={b}, rho={r}" for b in BANDWIDTHS for r in RHOS)
CELLS = DECIDING + MAP
CAPPED = tuple(f"bandwidth_mbps={b}, rho={r}" for b in ("5", "1.25") for r in ("1", "4"))
SEEDS = {c: 20 if c in DECIDING else 10 for c in CELLS}
#: each cell's planned T (its spec's max_seconds): tau of the restricted times and their margin
PLANNED_T = {
    "cell=A": 135.0,
    "cell=B": 360.0,
    "cell=M": 600.0,
    **{f"bandwidth_mbps={b}, rho={r}": 360.0 if r == "0.25" else 135.0 for b in BANDWIDTHS
       for r in RHOS},
}  # fmt: skip

ALPHA = 0.05
AUC_MARGIN, TIME_MARGIN, BYTES_MARGIN, BEATS_MARGIN = 0.9, 0.1, 1.05, 1.0
M_NOT_WORSE = len(CELLS) * len(OTHERS) * 2
M_BYTES = len(CELLS)
M_BEATS = len(CAPPED) * len(OTHERS)

#: an auto check's folder (``cell=<label>``, experiments/placement-3/auto.toml and auto-M.toml,
#: as mpirl.sweep.label writes the axis label "100,0.25") -> the stage-1 cell
AUTO_CELL = {
    **{f"cell={b}-{r}": f"bandwidth_mbps={b}, rho={r}" for b in BANDWIDTHS for r in RHOS},
    **{c: c for c in DECIDING},
}

Cell = dict[str, dict[int, dict[str, Any]]]  # arm -> seed -> row


@dataclass(frozen=True)
class Test:
    """One pre-registered test (module docstring)."""

    family: str  # "not worse", "no more bytes", "beats both"
    cell: str
    against: str  # the other arm
    outcome: str  # "AUC", "time to target", "link MB"
    estimate: float  # ratio (AUC, bytes) or seconds (time)
    low: float  # the simultaneous interval (1 - ALPHA / m)
    high: float
    n: int
    p: float  # one-sided, against the margin
    margin: float
    above: bool  # the claim is "above the margin" (AUC) or "below it" (time, bytes)
    p_holm: float = math.nan
    inclusive: bool = False  # "at or below" (bytes) rather than strictly past the margin
    #: why the test cannot speak (no target for the env; neither arm reached it by T): it
    #: neither clears nor misses, and its p is left out of Holm
    uninformative: str = ""
    unpaired: int = 0  # seeds in one arm only, or with a ratio's value <= 0 (left out)

    @property
    def _interval(self) -> bool:
        return not self.uninformative and math.isfinite(self.low) and math.isfinite(self.high)

    @property
    def cleared(self) -> bool:
        if not self._interval:
            return False
        if self.above:
            return self.low > self.margin
        return self.high <= self.margin if self.inclusive else self.high < self.margin

    @property
    def missed(self) -> bool:
        """The whole interval on the wrong side of the margin."""
        if not self._interval:
            return False
        return self.high < self.margin if self.above else self.low > self.margin

    @property
    def holm_only(self) -> bool:
        return (not self.cleared) and math.isfinite(self.p_holm) and self.p_holm < ALPHA / 2

    def status(self) -> str:
        if self.uninformative:
            return self.uninformative
        if self.cleared:
            return "clears"
        if self.missed:
            return "clear miss"
        return "Holm only, not claimed" if self.holm_only else f"not shown at n = {self.n}"

    def interval_text(self) -> str:
        if self.uninformative and not math.isfinite(self.estimate):
            return "-"
        if self.outcome == "time to target":
            if not math.isfinite(self.low):
                return f"{self.estimate:+.1f} s (no interval, n = {self.n})"
            return f"{self.estimate:+.1f} [{self.low:+.1f}, {self.high:+.1f}] s"
        if not math.isfinite(self.low):
            return f"{brief(self.estimate)} (no interval, n = {self.n})"
        return f"{brief(self.estimate)} [{brief(self.low)}, {brief(self.high)}]"


def _one_sided(mean: float, sd: float, n: int, margin: float, above: bool) -> float:
    """p of the one-sided t-test that the mean is past ``margin`` (above or below it)."""
    from scipy import stats

    if n < 2 or not math.isfinite(sd):
        return math.nan
    past = mean - margin if above else margin - mean
    if sd == 0.0:
        return 0.0 if past > 0 else 1.0
    return float(stats.t.sf(past / (sd / math.sqrt(n)), n - 1))


def ratio_test(
    family: str, cell: str, against: str, outcome: str, r: LogRatio, margin: float, m: int, above
) -> Test:
    lo, hi = r.interval(1 - ALPHA / m) if r.n >= 2 else (math.nan, math.nan)
    if r.n >= 2 and r.sd == 0.0:
        lo = hi = r.estimate
    mean = math.log(r.estimate) if r.n and r.estimate > 0 else math.nan
    p = _one_sided(mean, r.sd, r.n, math.log(margin), above)
    return Test(family, cell, against, outcome, r.estimate, lo, hi, r.n, p, margin, above,
                inclusive=family == "no more bytes", unpaired=r.unpaired)  # fmt: skip


def time_test(cell_name: str, cell: Cell, against: str, m: int) -> Test:
    d = time_diff(cell_name, cell, against)
    margin = TIME_MARGIN * PLANNED_T[cell_name]
    lo, hi = d.interval(1 - ALPHA / m) if d.n >= 2 else (math.nan, math.nan)
    if d.n >= 2 and d.sd == 0.0:
        lo = hi = d.estimate
    p = _one_sided(d.estimate, d.sd, d.n, margin, above=False)
    why = ""
    rows = [r for a in (NEW, against) for r in cell.get(a, {}).values()]
    if rows and not any(math.isfinite(float(r.get("target", math.nan))) for r in rows):
        why = "no target for this env"
    elif d.n and d.reached_learner == 0 and d.reached_buffer == 0:
        why = "neither arm reached the target by T"
    return Test("not worse", cell_name, against, "time to target", d.estimate, lo, hi, d.n,
                math.nan if why else p, margin, False, uninformative=why,
                unpaired=d.unpaired)  # fmt: skip


def _values(cell: Cell, arm: str, key: str) -> dict[int, float]:
    return {s: float(r.get(key, math.nan)) for s, r in cell.get(arm, {}).items()}


def auc_ratio(cell: Cell, against: str) -> LogRatio:
    return log_ratio_t(_values(cell, NEW, "auc_return"), _values(cell, against, "auc_return"))


def time_diff(cell_name: str, cell: Cell, against: str, arm: str = NEW) -> TimeDiff:
    """``arm`` - ``against``: restricted times to target, censored at the cell's planned T
    (`PLANNED_T`; a run that stopped before it is listed by `short_runs`)."""
    rows = [r for a in (arm, against) for r in cell.get(a, {}).values()]
    if not rows or not all(math.isfinite(float(r.get("target", math.nan))) for r in rows):
        return TimeDiff(math.nan, math.nan, math.nan, math.nan, 0)
    tau = PLANNED_T[cell_name]

    def side(a: str) -> dict[int, tuple[float, bool]]:
        return {
            s: (float(r["time_to_target_s"]), bool(r.get("reached")) and r.get("reached") == 1)
            for s, r in cell.get(a, {}).items()
        }

    return rmst_paired(side(arm), side(against), tau)


def cheaper(cell: Cell) -> str | None:
    """The one of learner and buffer with the smaller median link MB (learner on a tie); None
    while either has none."""
    med = {a: _median(cell, a, "link_mb") for a in OTHERS}
    if not all(math.isfinite(v) for v in med.values()):
        return None
    return min(OTHERS, key=lambda a: (med[a], OTHERS.index(a)))


def short_runs(cells: dict[str, Cell]) -> list[str]:
    """Runs whose T is under 95% of their cell's planned T (they stopped early)."""
    return [
        f"{c} {a} seed {s} (T {brief(float(r['T']))} s)"
        for c, cell in cells.items()
        for a in ARMS
        for s, r in sorted(cell.get(a, {}).items())
        if float(r.get("T", math.nan)) < 0.95 * PLANNED_T[c]
    ]


def _median(cell: Cell, arm: str, key: str) -> float:
    x = np.array(list(_values(cell, arm, key).values()), float)
    x = x[np.isfinite(x)]
    return float(np.median(x)) if len(x) else math.nan


def tests(cells: dict[str, Cell]) -> list[Test]:
    """Every test of the three families, each family's Holm p filled in."""
    nw, by, bb = [], [], []
    for c in CELLS:
        cell = cells.get(c, {})
        for o in OTHERS:
            nw.append(ratio_test("not worse", c, o, "AUC", auc_ratio(cell, o), AUC_MARGIN,
                                 M_NOT_WORSE, True))  # fmt: skip
            nw.append(time_test(c, cell, o, M_NOT_WORSE))
        for o in OTHERS:  # against both: implies "against the cheaper", with no choice
            r = log_ratio_t(_values(cell, NEW, "link_mb"), _values(cell, o, "link_mb"))
            by.append(ratio_test("no more bytes", c, o, "link MB", r, BYTES_MARGIN, M_BYTES,
                                 False))  # fmt: skip
        if c in CAPPED:
            for o in OTHERS:
                bb.append(ratio_test("beats both", c, o, "AUC", auc_ratio(cell, o), BEATS_MARGIN,
                                     M_BEATS, True))  # fmt: skip
    out = []
    for fam in (nw, bb):
        adj = holm([_for_holm(t) for t in fam])
        out += [Test(**{**t.__dict__, "p_holm": a}) for t, a in zip(fam, adj, strict=True)]
    # bytes: one claim per cell, both of its tests (intersection-union: its p is the larger)
    per_cell = [max(_for_holm(by[i]), _for_holm(by[i + 1])) for i in range(0, len(by), 2)]
    adj = holm(per_cell)
    out += [Test(**{**t.__dict__, "p_holm": adj[i // 2]}) for i, t in enumerate(by)]
    return out


def _for_holm(t: Test) -> float:
    """A test's p as Holm counts it: an uninformative one is no test (NaN, left out), one
    without a p yet (n < 2, interim) counts as p = 1 so Holm's m stays the planned family's."""
    if t.uninformative:
        return math.nan
    return t.p if math.isfinite(t.p) else 1.0


def seeds_run(cell: Cell) -> int:
    """Seeds run in every arm of the cell."""
    sets = [set(cell.get(a, {})) for a in ARMS]
    return len(set.intersection(*sets)) if sets else 0


def all_seeds_in(cells: dict[str, Cell]) -> bool:
    return all(seeds_run(cells.get(c, {})) >= SEEDS[c] for c in CELLS)


def verdicts(ts: list[Test]) -> dict[str, dict[str, str]]:
    """Per cell, each family's sentence (module docstring)."""
    out: dict[str, dict[str, str]] = {c: {} for c in CELLS}
    for c in CELLS:
        mine = [t for t in ts if t.cell == c]
        nw = [t for t in mine if t.family == "not worse"]
        speak = [t for t in nw if not t.uninformative]
        silent = sorted({t.uninformative for t in nw if t.uninformative})
        n = min((t.n for t in speak), default=0)
        miss = [f"{t.outcome} against {t.against}" for t in speak if t.missed]
        aucs = [t for t in speak if t.outcome == "AUC"]
        if len(aucs) == len(OTHERS) and all(t.cleared for t in speak):
            out[c]["not worse"] = "not worse than either" + (
                f" (time to target: {'; '.join(silent)})" if silent else ""
            )
        elif miss:
            out[c]["not worse"] = "worse: " + ", ".join(miss)
        else:
            out[c]["not worse"] = f"not shown at n = {n}"
        by = [t for t in mine if t.family == "no more bytes"]
        out[c]["no more bytes"] = _claim(by, "no more bytes than either", "more bytes than ")
        bb = [t for t in mine if t.family == "beats both"]
        if bb:
            out[c]["beats both"] = _claim(bb, "beats both", "loses to ")
    return out


def _claim(ts: list[Test], made: str, missed: str) -> str:
    """A claim that needs every test of ``ts`` to clear: ``made``, or ``missed`` + the arms
    with a clear miss, or "not shown"."""
    if all(t.cleared for t in ts):
        return made
    lost = [t.against for t in ts if t.missed]
    return missed + " and ".join(lost) if lost else f"not shown at n = {min(t.n for t in ts)}"


def placement_to_use(cells: dict[str, Cell], ts: list[Test]) -> dict[str, tuple[str, str]]:
    """Per cell: (the placement to use, the evidence), by the module docstring's rule."""
    out = {}
    v = verdicts(ts)
    for c in CELLS:
        cell = cells.get(c, {})
        if v[c].get("beats both") == "beats both":
            out[c] = (NEW, f"beats both on return AUC; {v[c]['no more bytes']}")
            continue
        if v[c]["not worse"].startswith("not worse than either") and not v[c][
            "no more bytes"
        ].startswith("more bytes"):
            out[c] = (NEW, f"{v[c]['not worse']}; {v[c]['no more bytes']}")
            continue
        r = log_ratio_t(
            _values(cell, "buffer", "auc_return"), _values(cell, "learner", "auc_return")
        )
        thin = f"thinned: {v[c]['not worse']}, {v[c]['no more bytes']}"
        if r.n >= 2 and math.isfinite(r.low) and (r.low > 1 or r.high < 1):
            best = "buffer" if r.low > 1 else "learner"
            out[c] = (best, f"buffer / learner AUC {r.text(2)} (95%, descriptive); {thin}")
        elif r.n >= 2:
            cheap = cheaper(cell)
            out[c] = (
                "either" + (f" ({cheap}: fewer bytes)" if cheap else ""),
                f"buffer / learner AUC {r.text(2)} (95%, descriptive); {thin}",
            )
        else:
            out[c] = ("-", f"too few seeds in learner and buffer (n = {r.n})")
    return out


# ---- auto's choices --------------------------------------------------------------------------


def auto_choices(root: Path) -> tuple[list[dict[str, str]], list[str]]:
    """What ``--replay-at auto`` chose in each auto check under ``root`` (its learner.h5
    attribute ``replay_at_auto_json``), one row per cell (`AUTO_CELL`), and the cells with no
    check there.  Folders the sweep set aside (``*.incomplete-<n>``) are not checks."""
    import h5py

    rows = {}
    for h5 in sorted(root.rglob("learner.h5")):
        if any(".incomplete" in p for p in h5.parts):
            continue
        folder = next((p for p in h5.parts if p in AUTO_CELL), None)
        if folder is None:
            continue
        with h5py.File(h5, "r") as f:
            raw = f.attrs.get("replay_at_auto_json")
        if raw is None:
            raise SystemExit(f"{h5}: no replay_at_auto_json attribute (not an auto run?)")
        advice = json.loads(raw)
        rows[AUTO_CELL[folder]] = {
            "cell": AUTO_CELL[folder],
            "replay_at": advice["replay_at"],
            "confidence": advice.get("confidence", ""),
            "why": advice.get("why", ""),
            "run": str(h5.parent),
        }
    missing = [c for c in CELLS if c not in rows]
    return [rows[c] for c in CELLS if c in rows], missing


def write_auto(rows: list[dict[str, str]], data: Path = DATA) -> Path:
    path = data / "auto.csv"
    old = {r["cell"]: r for r in (read_rows(path) if path.exists() else [])}
    old.update({r["cell"]: r for r in rows})
    data.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, AUTO_FIELDS, extrasaction="ignore")
        w.writeheader()
        w.writerows(sorted(old.values(), key=lambda r: CELLS.index(r["cell"])))
    return path


# ---- the section -----------------------------------------------------------------------------


def read_stage1(data: Path = DATA) -> tuple[dict[str, Cell], dict[str, str]]:
    rows = read_rows(data / "runs.csv") if (data / "runs.csv").exists() else []
    cells = {c: v for c, v in by_cell(rows).items() if c in CELLS}
    auto = {}
    if (data / "auto.csv").exists():
        auto = {str(r["cell"]): str(r["replay_at"]) for r in read_rows(data / "auto.csv")}
    return cells, auto


def _iqm(x: list[float]) -> float:
    from scipy import stats

    a = np.array([v for v in x if math.isfinite(v)], float)
    return float(stats.trim_mean(a, 0.25)) if len(a) else math.nan


def _secondary(c: str, cell: Cell) -> list[str]:
    head = ["arm", "seeds", "AUC", "final IQM", "time to target (reached)", "link MB",
            "delivered", "updates/s", "unweighted loss", "IS-weighted loss",
            "trained / null \\|td\\| Q1-Q4", "kept f / budget"]  # fmt: skip
    rows = []
    for a in ARMS:
        side = cell.get(a, {})
        if not side:
            continue
        med = lambda k, a=a: brief(_median(cell, a, k))  # noqa: E731
        tq = [_median_ratio(cell, a, f"batch_td_q{k}", f"null_td_q{k}") for k in (1, 2, 3, 4)]
        if a == NEW:
            d = time_diff(c, cell, "learner", arm=NEW)
            rm, hit = d.rmst_buffer, d.reached_buffer
        else:
            d = time_diff(c, cell, NEW, arm=a)
            rm, hit = d.rmst_buffer, d.reached_buffer
        rows.append(
            [
                a,
                str(len(side)),
                med("auc_return"),
                brief(_iqm(list(_values(cell, a, "final_return").values()))),
                f"{brief(rm)} s ({hit}/{d.n})" if d.n else "-",
                med("link_mb"),
                med("delivered_fraction"),
                med("U"),
                med("train_loss_unweighted"),
                med("train_loss"),
                ", ".join(brief(x) for x in tq) if any(math.isfinite(x) for x in tq) else "-",
                f"{med('thin_kept')} / {med('thin_budget')}" if a == NEW else "-",
            ]
        )
    return [f"**{c}** (medians over seeds; not tested):", "", md_table(head, rows)]


def _median_ratio(cell: Cell, arm: str, num: str, den: str) -> float:
    x = np.array(
        [float(r.get(num, math.nan)) / float(r.get(den, math.nan)) for r in cell[arm].values()],
        float,
    )
    x = x[np.isfinite(x)]
    return float(np.median(x)) if len(x) else math.nan


def stage1_section(data: Path = DATA) -> str:
    """docs/results.md's ``placement3`` section from the committed rows."""
    cells, auto = read_stage1(data)
    n_runs = sum(len(s) for cell in cells.values() for s in cell.values())
    planned = sum(SEEDS[c] * len(ARMS) for c in CELLS)
    if not n_runs:
        return (
            f"Stage 1 has not run yet: 0 of {planned} runs (experiments/placement-3/*.toml). "
            "This section is generated from `docs/results/data/placement-3/runs.csv` by the "
            "analysis committed before any of them (`analysis.placement3`)."
        )
    done = all_seeds_in(cells)
    lines = [
        f"{n_runs} of {planned} runs. "
        + (
            "Every cell has its planned seeds: the decisions below are the plan's."
            if done
            else "**Interim**: not every cell has its planned seeds, so nothing below is "
            "decided; the intervals are already at the final simultaneous level."
        )
    ]
    ts = tests(cells)
    lines += _use_block(cells, ts, auto, done) + _tests_block(cells, ts)
    short = short_runs(cells)
    if short:
        lines += [
            f"Runs that stopped before 95% of their cell's T ({len(short)}; their time to "
            "target counts as not reached by T): " + ", ".join(short) + ".",
            "",
        ]
    lines += ["Forest plots, one per family (point, simultaneous interval, the margin in red):", ""]
    drawn = {t.family for t in ts if t.cell in cells}  # as `stage1_figures` draws them
    lines += [
        f"![{fam}](results/placement-3/{name}.png)"
        for fam, name in FAMILY_FILES.items()
        if fam in drawn
    ]
    lines.append("")
    for c in CELLS:
        if c in cells:
            lines += _secondary(c, cells[c])
    return "\n".join(lines).rstrip()


def _agrees(pick: str, auto: str) -> str:
    """How auto's choice stands to the headline's pick."""
    if auto == "-" or pick == "-":
        return ""
    if auto == pick:
        return " (same)"
    return " (one of either)" if pick.startswith("either") and auto in OTHERS else " (differs)"


def _use_block(cells: dict[str, Cell], ts: list[Test], auto: dict[str, str], done: bool) -> list:
    """The headline: the link x rho grid, then every cell with its evidence and auto's choice."""
    hl = placement_to_use(cells, ts)
    head_rows = [
        [c, f"{seeds_run(cells[c])}/{SEEDS[c]}", hl[c][0], hl[c][1],
         auto.get(c, "-") + _agrees(hl[c][0], auto.get(c, "-"))]
        for c in CELLS
        if c in cells
    ]  # fmt: skip
    grid = [
        [f"{b} Mb/s"] + [hl[f"bandwidth_mbps={b}, rho={r}"][0] for r in RHOS] for b in BANDWIDTHS
    ]
    return [
        "",
        "**Where should the replay memory live?** (the plan's rule; "
        + ("decided" if done else "interim, not decided")
        + "): by link rate and replay ratio (CartPole-v1, 12,000 env steps/s, 30 ms), then "
        "every cell with its evidence and what `--replay-at auto` chose.",
        "",
        md_table(["link", *(f"rho {r}" for r in RHOS)], grid),
        md_table(["cell", "seeds", "use", "evidence", "auto chose"], head_rows),
    ]


def _tests_block(cells: dict[str, Cell], ts: list[Test]) -> list:
    """The per-cell claims, then every test with its simultaneous interval."""
    v = verdicts(ts)
    head = ["family", "cell", "outcome", "thinned against", "estimate [simultaneous]", "margin",
            "n", "p", "Holm p", "status"]  # fmt: skip
    rows = [
        [t.family, t.cell, t.outcome, t.against, t.interval_text(),
         f"+{t.margin:.1f} s" if t.outcome == "time to target" else f"{t.margin:g}",
         str(t.n) + (f" ({t.unpaired} unpaired)" if t.unpaired else ""),
         brief(t.p), brief(t.p_holm), t.status()]
        for t in ts
        if t.cell in cells
    ]  # fmt: skip
    return [
        "Per cell, the three claims (thinned against the others):",
        "",
        md_table(
            ["cell", "not worse (m = 48)", "no more bytes (m = 12)", "beats both (m = 8)"],
            [
                [c, v[c]["not worse"], v[c]["no more bytes"], v[c].get("beats both", "-")]
                for c in CELLS
                if c in cells
            ],
        ),
        "Every test (one-sided against its margin; interval at 1 - 0.05/m, whose end on the "
        "margin's side decides; Holm's p beside, for bytes per cell over both arms' tests; "
        "unpaired: seeds in one arm only, or with a value <= 0, left out of the ratio):",
        "",
        md_table(head, rows),
    ]


FIGURES = ROOT / "docs" / "results" / "placement-3"
FAMILY_FILES = {"not worse": "forest-not-worse", "no more bytes": "forest-bytes",
                "beats both": "forest-beats-both"}  # fmt: skip


def stage1_figures(data: Path = DATA, out: Path = FIGURES) -> list[Path]:
    """A forest plot per family (``FAMILY_FILES``): one row per test, its simultaneous interval
    and its margin; nothing before stage 1's first rows."""
    from analysis.plots import ForestRow, plot_forest

    cells, _ = read_stage1(data)
    if not cells:
        return []
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for fam, name in FAMILY_FILES.items():
        rows = [
            ForestRow(f"{t.cell}: {t.outcome} vs {t.against}", t.estimate, t.low, t.high,
                      unit="s" if t.outcome == "time to target" else "ratio", margin=t.margin)
            for t in tests(cells)
            if t.family == fam and t.cell in cells
        ]  # fmt: skip
        if rows:
            paths.append(
                plot_forest(
                    rows,
                    out / f"{name}.png",
                    f"Stage 1, {fam}: thinned against each other arm",
                    {
                        "ratio": "thinned / other, simultaneous interval",
                        "s": "thinned - other (s), simultaneous interval",
                    },
                )  # fmt: skip
            )
    return paths


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m analysis.placement3",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--auto", type=Path, help="the auto checks' run folders (auto.csv)")
    ap.add_argument("--data", type=Path, default=DATA)
    a = ap.parse_args(argv)
    if a.auto:
        if not a.auto.exists():
            print(f"analysis.placement3: {a.auto} does not exist", file=sys.stderr)
            return 2
        rows, missing = auto_choices(a.auto)
        print(f"analysis.placement3: {len(rows)} auto choices into {write_auto(rows, a.data)}")
        if missing:
            print(
                f"analysis.placement3: no auto check under {a.auto} for {', '.join(missing)}: "
                "run experiments/placement-3/auto.toml and auto-M.toml",
                file=sys.stderr,
            )
        return 1 if missing else 0
    print(stage1_section(a.data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
