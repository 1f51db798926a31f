"""analysis.equal_time: docs/results.md's equal-wall-time section from committed rows, on
synthetic rows whose effects are known, so every branch of the Plan's rule is reached."""

from __future__ import annotations

import csv
import math

import numpy as np
import pytest

from analysis import equal_time as E
from analysis.export import CURVE_FIELDS, GRID, RUN_FIELDS

SEEDS = range(20)


def _rows(
    cell,
    arm,
    rng,
    *,
    loss=1.0,
    loss_unweighted=None,
    prio=1.0,
    auc=100.0,
    noise=0.05,
    P=12000.0,
    U=187.5,
    seeds=SEEDS,
    target=475.0,
    reach_t=50.0,
    P_req=None,
    U_req=None,
):
    out = []
    for s in seeds:
        jitter = lambda: math.exp(noise * rng.standard_normal())  # noqa: E731
        out.append(
            {
                "run": f"runs/x/{cell}/replay_at={arm}/seed{s}",
                "cell": cell,
                "replay_at": arm,
                "seed": s,
                "T": 90.0,
                "P": P,
                "U": U,
                "rho": U * 64 / P,
                "P_requested": P_req or P,
                "U_requested": U_req or U,
                "delivered_fraction": 0.5 if arm == "learner" else "",
                "train_loss": loss * jitter(),
                "train_loss_unweighted": (loss_unweighted or loss) * jitter(),
                "prio_td_held": prio * jitter(),
                "prio_held": prio * jitter(),
                "arrival_td": prio * jitter(),
                "auc_return": auc * jitter(),
                "final_return": auc * jitter(),
                "return_per_mb": auc * jitter(),
                "target": target,
                "reached": int(reach_t < 90),
                "time_to_target_s": min(reach_t * jitter(), 90.0),
                "load_max": 1.5,
            }
        )
    return out


def _write(tmp_path, rows, ret=lambda t: min(t * 5, 500)):
    data = tmp_path / "data"
    data.mkdir()
    with (data / "runs.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=RUN_FIELDS, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    with (data / "curves.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CURVE_FIELDS)
        w.writeheader()
        for r in rows:
            for k in range(GRID + 1):
                t = 90.0 * k / GRID
                w.writerow(
                    {
                        "run": r["run"],
                        "t": t,
                        "return": ret(t),
                        "link_mb": t,
                        "train_loss": 1.0,
                        "prio_td_held": 1.0,
                    }
                )
    return data


@pytest.fixture
def page(tmp_path):
    rng = np.random.default_rng(0)
    rows = (
        _rows("cell=A", "learner", rng)
        + _rows("cell=A", "buffer", rng, loss=0.26, prio=1.5)
        + _rows("cell=B", "learner", rng, U=46.875)
        + _rows(
            "cell=B",
            "buffer",
            rng,
            loss=1.5,
            prio=4.0,
            U=30.0,
            U_req=46.875,
            auc=150.0,
            reach_t=30.0,
        )
        + _rows("cell=C", "learner", rng, loss=1.5, U=23.4)
        + _rows(
            "cell=M", "learner", rng, noise=0.5, P=4500, U=17.6, seeds=range(10), target=math.nan
        )
        + _rows(
            "cell=M", "buffer", rng, noise=0.5, P=4500, U=17.6, seeds=range(10), target=math.nan
        )
    )
    data = _write(tmp_path, rows)
    return E.section(data), data


LOSS = "training loss (unweighted TD)"


def test_the_rule_gives_each_outcome(page):
    text, _ = page

    def line(prefix):
        return next(ln for ln in text.splitlines() if ln.startswith(prefix))

    assert line(f"| cell=A | {LOSS} (0.26)").endswith("| matches the paper |")
    assert line("| cell=A | transferred priority").endswith(
        "| same direction, smaller than the paper |"
    )
    assert line(f"| cell=B | {LOSS} (0.26)").endswith("| opposite direction |")
    assert line("| cell=B | transferred priority").endswith("| matches the paper |")
    assert line(f"| cell=M | {LOSS} (0.26)").endswith("| inconclusive at n = 10 |")
    assert "Confirmatory family F: 6 tests" in text
    assert text.startswith("**training loss (unweighted TD) (paper 0.26x): reproduced.**")
    assert "**transferred priority (|td|+eps) (paper 3.92x): not reproduced (same direction" in text
    # descriptive: the cells whose simultaneous interval excludes the paper's value
    outside = "lies outside the simultaneous interval in 2 of 3 cells"
    assert f"The paper's 0.26x {outside} (cell=B, cell=M; descriptive" in text
    assert f"The paper's 3.92x {outside} (cell=A, cell=M; descriptive" in text


def test_marks_control_survival_and_map(page):
    text, _ = page
    # cell B's proposed placement did not hold its U (30 of 46.9): marked
    assert (
        "Marked: achieved rates miss the requested ones by more than 10%:** proposed U 30" in text
    )
    assert "#### cell=A" in text and "Marked" not in text.split("#### cell=A")[1].split("####")[0]
    # C's proposed arm is B's: the control compares against B's proposed runs
    assert "in cell C (equal)" in text
    # time to target: B's proposed reaches at ~30 s, existing at ~50 s
    b = text.split("#### cell=B")[1].split("####")[0]
    assert "reached 20/20 existing, 20/20 proposed (seed pairs)" in b and "paired t p" in b
    m_block = text.split("#### cell=M")[1].split("####")[0].split("**Where")[0]
    assert "Time to target" not in m_block  # no target
    assert "| cell=B | **proposed**, 1.4" in text  # AUC 150 against 100
    assert "| cell=A | no difference shown at n = 20" in text
    # family U as the Plan names it: time to target in the cells with a target (not M)
    assert "Holm at 0.05 over its 8 tests" in text
    assert "| cell=M | no difference shown at n = 10, " in text and "not tested (no target)" in (
        next(x for x in text.splitlines() if x.startswith("| cell=M | no difference"))
    )
    line_b = next(x for x in text.splitlines() if x.startswith("| cell=B | **proposed**"))
    assert line_b.split(" | ")[2].startswith("**proposed**, -")  # B's proposed arm reaches sooner
    # the table in one generated sentence per outcome, B named as marked
    answer = (
        "**In words (family U, 8 tests, every cell complete):** Return AUC: proposed higher in 1 "
        "(cell=B); no difference shown in 2 (cell=A; cell=M). Time to target: proposed sooner in "
        "1 (cell=B); no difference shown in 1 (cell=A). Return per MB: proposed higher in "
        "1 (cell=B); no difference shown in 2 (cell=A; cell=M). Marked cells"
    )
    assert answer in text and text.split(answer)[1].split("\n")[0].endswith(": cell=B.")
    # the curves rise 5 per second to T = 90: on the 48-step grid the last quarter's mean t is
    # 78.75 s, the third quarter's 55.3 s (1.42x)
    m = text.split("#### cell=M")[1].split("####")[0]
    assert "existing 1.42x, proposed 1.42x; still rising by more than 5% in 10/10 and 10/10" in m
    assert "the curve had not flattened by T." in m


def test_control_shows_both_loss_readings_and_says_when_they_disagree(tmp_path):
    # as in the committed cell C: C's existing arm makes half the updates of B's proposed arm,
    # so its IS weights use a smaller beta; the IS-weighted ratio falls below 1 while the
    # unweighted one rises above it. The sentence must show both and name the disagreement.
    rng = np.random.default_rng(3)
    rows = (
        _rows("cell=B", "learner", rng, U=46.875)
        + _rows("cell=B", "buffer", rng, loss=1.0, loss_unweighted=1.3, U=46.875)
        + _rows("cell=C", "learner", rng, loss=1.8, loss_unweighted=1.0, U=23.4)
    )
    text = E.section(_write(tmp_path, rows))
    control = next(ln for ln in text.splitlines() if ln.startswith("**Matched control.**"))
    unweighted, weighted = control.split("; IS-weighted ")
    c_weighted = float(weighted.split("transition), ")[1].split()[0])
    c_unweighted = float(unweighted.split("transition), ")[1].split()[0])
    assert 0.5 < c_weighted < 0.6 and 1.2 < c_unweighted < 1.4  # 1.0 / 1.8 and 1.3 / 1.0
    assert "the two readings point in opposite directions" in control
    assert "makes 0.50x the updates" in control
    assert "do not show that the loss difference is a replay-ratio effect" in control


def test_figures_are_written(page, tmp_path):
    pytest.importorskip("matplotlib")
    _, data = page
    paths = E.figures(data, tmp_path / "fig")
    assert {p.name for p in paths} == {
        "cell-A.png",
        "cell-B.png",
        "cell-C.png",
        "cell-M.png",
        "forest-F.png",
        "forest-U.png",
    }
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in paths)


def test_no_data_yet(tmp_path):
    assert "has been committed yet" in E.section(tmp_path / "none")


def test_pilot_picks_the_bandwidth_the_plan_names(tmp_path):
    rng = np.random.default_rng(1)
    rows = []
    for bw, delivered, u_prop in ((2.0, 0.40, 30.0), (2.5, 0.52, 46.0), (3.0, 0.63, 46.9)):
        cell = f"bandwidth_mbps={bw:g}"
        for r in _rows(cell, "learner", rng, U=46.875, seeds=[0]):
            rows.append({**r, "delivered_fraction": delivered})
        rows += _rows(cell, "buffer", rng, U=u_prop, U_req=46.875, seeds=[0])
    text = E.pilot_section(_write(tmp_path, rows))
    # 2 Mb/s: the proposed placement missed its U; 3 Mb/s: the existing one delivered 63%
    assert "**b\\* = 2.5 Mb/s**: the existing placement delivered 52%" in text
    assert "(f = 0.520). Cell C's U is f_B x 46.875" in text
    assert text.count("| 2 Mb/s |") == 1 and "| 3 Mb/s |" in text
    rows = [r for r in rows if not r["cell"].endswith("2.5")]
    (tmp_path / "b").mkdir()
    assert "No pilot bandwidth met both" in E.pilot_section(_write(tmp_path / "b", rows))


def test_an_incomplete_family_decides_nothing(tmp_path):
    """Cell A alone with 12 of its 20 pairs, a clear effect in the data: every outcome is
    interim and the verdict says not decided (the Plan decides at its planned pairs only)."""
    rng = np.random.default_rng(2)
    seeds = range(12)
    rows = _rows("cell=A", "learner", rng, seeds=seeds) + _rows(
        "cell=A", "buffer", rng, loss=0.26, prio=1.5, seeds=seeds
    )
    text = E.section(_write(tmp_path, rows))
    assert text.startswith(f"**{LOSS} (paper 0.26x): not decided yet (interim")
    assert "reproduced" not in text.split("Pairs per cell")[0]
    row = next(x for x in text.splitlines() if x.startswith(f"| cell=A | {LOSS} (0.26)"))
    assert row.endswith(
        "| interim, not decided (pairs: cell=A 12 of 20, cell=B 0 of 20, cell=M 0 of 10) |"
    )


def test_control_rule_reads_the_primary_loss(tmp_path):
    # the mechanism rule is on the unweighted TD loss (primary since issue 47): B below 1 and C's
    # interval containing 1 is "consistent", whatever the IS-weighted reading shows beside it
    # (here 1 in B: the old rule, on the IS-weighted loss, said "do not show")
    rng = np.random.default_rng(4)
    rows = (
        _rows("cell=B", "learner", rng, U=46.875)
        + _rows("cell=B", "buffer", rng, loss=1.0, loss_unweighted=0.5, U=46.875)
        + _rows("cell=C", "learner", rng, loss=1.0, loss_unweighted=0.5, U=23.4)
    )
    text = E.section(_write(tmp_path, rows))
    assert "The data are consistent with a replay-ratio effect." in text
    assert "opposite directions" not in text
    control = next(ln for ln in text.splitlines() if ln.startswith("**Matched control.**"))
    assert control.index("unweighted TD") < control.index("IS-weighted")


def test_control_without_the_unweighted_loss_says_not_logged(tmp_path):
    # rows exported before /updates/loss_unweighted was logged: no reading, no zeros
    rng = np.random.default_rng(4)
    rows = (
        _rows("cell=B", "learner", rng, U=46.875)
        + _rows("cell=B", "buffer", rng, loss=0.5, U=46.875)
        + _rows("cell=C", "learner", rng, loss=0.5, U=23.4)
    )
    for r in rows:
        r["train_loss_unweighted"] = ""
    text = E.section(_write(tmp_path, rows))
    control = next(ln for ln in text.splitlines() if ln.startswith("**Matched control.**"))
    assert "unweighted TD not logged in these runs" in control
    assert "The rule reads the unweighted loss, not logged in these runs: no reading." in control


def test_flattened_curves_say_so(tmp_path):
    # the curve reaches its plateau at t = 40 of T = 90: both late quarters are flat
    rng = np.random.default_rng(5)
    rows = _rows("cell=A", "learner", rng) + _rows("cell=A", "buffer", rng)
    text = E.section(_write(tmp_path, rows, ret=lambda t: min(t * 5, 200)))
    assert "existing 1x, proposed 1x; still rising by more than 5% in 0/20 and 0/20 runs" in text
    assert "the curve had flattened by T." in text


def test_a_metric_no_run_measured_is_a_line_not_a_row(tmp_path):
    # cell=M's runs had no reference set: its table carries no "n = 0" row; cell=A's runs had one
    rng = np.random.default_rng(6)
    a = _rows("cell=A", "learner", rng) + _rows("cell=A", "buffer", rng)
    for r in a:
        r["ref_loss_norm"] = 2.0
    m = _rows("cell=M", "learner", rng, seeds=range(10)) + _rows(
        "cell=M", "buffer", rng, seeds=range(10)
    )
    text = E.section(_write(tmp_path, a + m))
    block_a, block_m = text.split("#### cell=A")[1].split("#### cell=M")
    name = "reference loss / mean Q^2 (secondary)"
    assert f"| {name} | 1 [" in block_a and "Not measured" not in block_a
    assert "n = 0" not in block_m and f"| {name} |" not in block_m
    assert f"Not measured in this cell's runs: {name}." in block_m


def test_a_map_cell_short_of_its_pairs_is_interim_in_family_u(tmp_path):
    # one seed of a map cell: its entries say interim, not "no difference shown at n = 1"
    rng = np.random.default_rng(7)
    rows = _rows("cell=A", "learner", rng) + _rows("cell=A", "buffer", rng, auc=150.0)
    cell = "bandwidth_mbps=5,rho=1"
    rows += _rows(cell, "learner", rng, seeds=range(1)) + _rows(cell, "buffer", rng, seeds=range(1))
    text = E.section(_write(tmp_path, rows))
    table = text.split("**Where should the replay memory live?**")[1]
    assert "**Interim:** 1 cell(s) do not have their planned pairs yet" in table
    line = next(x for x in table.splitlines() if x.startswith(f"| {cell} |"))
    assert "no difference shown" not in line
    line_a = next(x for x in table.splitlines() if x.startswith("| cell=A |"))
    assert "**proposed**" in line_a  # a complete cell keeps its outcome
    assert line.count("interim, n = 1 of 10") == 3  # return AUC, time to target, per MB
    # one run per placement: no spread, so no interval is claimed (as in the cell block)
    assert "s (no interval, n = 1)" in line.split(" | ")[2] and "[+" not in line.split(" | ")[2]
    assert "**In words (family U, 6 tests; complete cells only" in table
    assert (
        "Return AUC: proposed higher in 1 (cell=A)." in table
        and cell not in table.split("**In words")[1].split("![")[0]
    )


def test_a_cell_with_one_placement_run_says_so(tmp_path):
    # a sitting that stops between a seed's two runs: no empty table, no "not measured" list
    rng = np.random.default_rng(8)
    cell = "bandwidth_mbps=100,rho=1"
    rows = _rows("cell=A", "learner", rng) + _rows("cell=A", "buffer", rng)
    rows += _rows(cell, "learner", rng, seeds=range(1))
    block = E.section(_write(tmp_path, rows)).split(f"#### {cell}")[1].split("**Where")[0]
    assert "No seed has run in both placements yet: no ratios." in block
    assert "| metric |" not in block and "Not measured" not in block


def test_time_to_target_of_one_seed_has_no_interval(tmp_path):
    # one run per placement has no spread, so "+97.8 [+97.8, +97.8]" would claim a certainty
    # the data cannot give; a cell with 2 or more runs per placement keeps its interval
    rng = np.random.default_rng(9)
    cell = "bandwidth_mbps=1.25,rho=0.25"
    rows = _rows("cell=A", "learner", rng) + _rows("cell=A", "buffer", rng, reach_t=30.0)
    rows += _rows(cell, "learner", rng, seeds=range(1)) + _rows(
        cell, "buffer", rng, seeds=range(1), reach_t=30.0
    )
    text = E.section(_write(tmp_path, rows))
    one = next(x for x in text.split(f"#### {cell}")[1].splitlines() if "Time to target" in x)
    assert "(no interval, n = 1), p -" in one and "[" not in one
    many = next(x for x in text.split("#### cell=A")[1].splitlines() if "Time to target" in x)
    assert "[" in many and "no interval" not in many


def test_what_the_learner_trains_on_by_quarter(tmp_path):
    # issue 47: trained-batch |td| proposed / existing by quarter (3x early, 1.5x late), and the
    # within-placement null: the existing placement trains on 2x the |td| that arrived; the
    # proposed one has no null logged (nothing it stores is measured): said, not a zero
    rng = np.random.default_rng(10)
    rows = _rows("cell=A", "learner", rng) + _rows("cell=A", "buffer", rng)
    for r in rows:
        j = math.exp(0.05 * rng.standard_normal())
        prop = r["replay_at"] == "buffer"
        for k, f in zip(E.QUARTERS, (3.0, 2.5, 2.0, 1.5), strict=True):
            r[f"batch_td_q{k}"] = (f if prop else 1.0) * j
            r[f"null_td_q{k}"] = "" if prop else 0.5 * j
        r["batch_td"] = (2.25 if prop else 1.0) * j
    text = E.section(_write(tmp_path, rows))
    line = next(x for x in text.splitlines() if x.startswith("| cell=A | 20 |"))
    cols = [c.strip() for c in line.strip("|").split("|")]
    assert [float(c.split()[0]) for c in cols[2:7]] == pytest.approx(
        [2.25, 3.0, 2.5, 2.0, 1.5], rel=0.03
    )
    assert cols[7] == "2, 2, 2, 2"
    assert cols[8].startswith("not logged") and "0" not in cols[8]
    # rows exported before the columns existed: one line, no table, no zeros
    (tmp_path / "old").mkdir()
    old = E.section(
        _write(tmp_path / "old", _rows("cell=A", "learner", rng) + _rows("cell=A", "buffer", rng))
    )
    said = next(x for x in old.splitlines() if x.startswith("**What the learner trains on**"))
    assert "not logged in these runs" in said and "| Q1 |" not in old


def test_forest_rows_are_the_tables_numbers(page):
    # issue 47 item 4: one row per (cell, outcome) of each family, the interval its table shows,
    # the paper's value on F's rows only, time to target in seconds
    _, data = page
    cells = E.plan_cells(E.read(data)[0])
    rows = E.forest_rows(cells)
    fam = {r.label: r for r in rows["F"]}
    assert len(fam) == 6 and {r.paper for r in fam.values()} == {0.26, 3.92}
    a = fam["cell=A: training loss (unweighted TD)"]
    want = next(
        r
        for c, k, r, _, _ in E.family_tests(cells)
        if c == "cell=A" and k == "train_loss_unweighted"
    )
    assert (a.estimate, a.low, a.high, a.unit) == (want.estimate, want.low, want.high, "ratio")
    u = {r.label: r for r in rows["U"]}
    assert len(u) == 8 and all(r.paper is None for r in u.values())
    assert u["cell=B: time to target"].unit == "s" and u["cell=B: time to target"].estimate < 0
    assert u["cell=M: return AUC"].unit == "ratio"


def test_forest_plot_renders_from_synthetic_rows(tmp_path):
    """analysis.plots.plot_forest: ratios and differences in seconds in one figure (two panels),
    a row without an interval, the paper's value on some rows; a PNG comes out."""
    pytest.importorskip("matplotlib")
    from analysis.plots import ForestRow, plot_forest

    rows = [
        ForestRow("cell=A: training loss", 1.15, 0.89, 1.47, 0.26),
        ForestRow("cell=A: transferred priority", 9.4, 7.5, 11.6, 3.92),
        ForestRow("cell=B: return AUC", 0.95, float("nan"), float("nan")),
        ForestRow("cell=B: time to target", -30.2, -69.7, 9.3, None, "s"),
    ]
    path = plot_forest(rows, tmp_path / "forest.png", "synthetic")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    from PIL import Image

    w, h = Image.open(path).size
    assert w > 2 * h  # two panels side by side
    one = plot_forest(rows[:2], tmp_path / "one.png")
    assert Image.open(one).size[0] < w  # one unit, one panel


def test_a_third_placement_is_its_own_side_of_a_cell():
    """analysis.tables.by_cell: a thinned run is not read as the buffer placement (it was: every
    replay_at but learner went to the buffer side, so a three-arm cell's buffer seeds were
    overwritten by thinned's)."""
    from analysis.tables import by_cell

    rows = [
        {"cell": "c", "replay_at": place, "seed": s, "auc_return": auc + s}
        for place, auc in (("learner", 100.0), ("buffer", 200.0), ("thinned", 300.0))
        for s in (0, 1)
    ]
    cell = by_cell(rows)["c"]
    assert sorted(cell) == ["buffer", "learner", "thinned"]
    assert [r["auc_return"] for r in cell["buffer"].values()] == [200.0, 201.0]
    assert [r["auc_return"] for r in cell["thinned"].values()] == [300.0, 301.0]
    two = by_cell([r for r in rows if r["replay_at"] == "learner"])["c"]
    assert two["buffer"] == {} and sorted(two) == ["buffer", "learner"]
