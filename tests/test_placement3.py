"""analysis.placement3, stage 1's pre-registered analysis (experiments/placement-3/plan.md), on
synthetic exported rows: the three families' decisions, that every decision is its printed
interval's, interim until every cell has its seeds, the headline's rule and auto's choices."""

import csv
import json
import math

import h5py
import numpy as np
import pytest

from analysis import placement3 as P
from analysis.export import RUN_FIELDS
from analysis.tables import field


def _rows(auc, time=None, mb=None, seeds=None, drop=()):
    """Every cell x arm x planned seed. ``auc(cell, arm, seed)`` -> return AUC;
    ``time(cell, arm, seed)`` -> time to target (None: not reached); ``mb(cell, arm)``."""
    rng = np.random.default_rng(0)
    time = time or (lambda c, a, s: 60.0 + rng.normal(0, 1))
    mb = mb or (lambda c, a: {"learner": 50.0, "buffer": 80.0, "thinned": 30.0}[a])
    out = []
    for c in P.CELLS:
        big_t = P.PLANNED_T[c]
        for a in P.ARMS:
            for s in range((seeds or P.SEEDS)[c]):
                if (c, a, s) in drop:
                    continue
                t = time(c, a, s)
                out.append(
                    {"run": f"runs/x/{c}/replay_at={a}/seed{s}", "cell": c, "replay_at": a,
                     "seed": s, "T": big_t, "auc_return": auc(c, a, s),
                     "final_return": auc(c, a, s) * 1.2, "target": 475.0,
                     "reached": t is not None, "time_to_target_s": big_t if t is None else t,
                     "link_mb": mb(c, a) * (1 + 0.01 * rng.normal()), "U": 47.0,
                     "delivered_fraction": 0.5, "train_loss": 0.001,
                     "train_loss_unweighted": 0.1, "batch_td_q1": 2.0, "null_td_q1": 1.0,
                     "thin_kept": 0.25 if a == "thinned" else math.nan,
                     "thin_budget": 0.25 if a == "thinned" else math.nan}
                )  # fmt: skip
    return out


def _write(tmp, rows, auto=None):
    with open(tmp / "runs.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, RUN_FIELDS, extrasaction="ignore")
        w.writeheader()
        w.writerows([{k: field(v) for k, v in r.items()} for r in rows])
    if auto:
        P.write_auto([{"cell": c, "replay_at": a} for c, a in auto.items()], tmp)
    return tmp


def noisy(level):
    """AUC = level(cell, arm) x a per-seed factor shared by the arms (paired) x 1% own noise."""
    rng = np.random.default_rng(1)
    cache = {}

    def f(c, a, s):
        if (c, s) not in cache:
            cache[c, s] = rng.lognormal(0, 0.2)
        return level(c, a) * cache[c, s] * rng.lognormal(0, 0.01)

    return f


def test_a_design_that_wins_everywhere_clears_every_claim(tmp_path):
    """Thinned as good as the learner arm (buffer at 0.5x), 1.5x the learner arm in the capped
    cells, fewest bytes: every claim clears, and the headline names thinned everywhere."""

    def level(c, a):
        return {"learner": 400, "buffer": 200, "thinned": 400 * (1.5 if c in P.CAPPED else 1)}[a]

    cells, _ = P.read_stage1(_write(tmp_path, _rows(noisy(level))))
    assert P.all_seeds_in(cells)
    ts = P.tests(cells)
    assert len([t for t in ts if t.family == "not worse"]) == P.M_NOT_WORSE == 48
    assert len([t for t in ts if t.family == "no more bytes"]) == 2 * P.M_BYTES == 24
    assert len([t for t in ts if t.family == "beats both"]) == P.M_BEATS == 8
    v = P.verdicts(ts)
    assert all(v[c]["not worse"] == "not worse than either" for c in P.CELLS), v
    assert all(v[c]["no more bytes"] == "no more bytes than either" for c in P.CELLS)
    assert all(v[c]["beats both"] == "beats both" for c in P.CAPPED)
    assert {pick for pick, _ in P.placement_to_use(cells, ts).values()} == {"thinned"}
    page = P.stage1_section(tmp_path)
    assert "Interim" not in page and "the decisions below are the plan's" in page
    assert "| 1.25 Mb/s | thinned | thinned | thinned |" in page  # the link x rho grid


def test_every_decision_is_its_printed_interval(tmp_path):
    """A test clears exactly when its one-sided p is below 0.025 / m (the interval's end past
    the margin), and whatever Holm says it never claims more."""
    rng = np.random.default_rng(5)
    level = lambda c, a: {"learner": 400, "buffer": 380, "thinned": 390}[a]  # noqa: E731
    auc = noisy(level)
    rows = _rows(lambda c, a, s: auc(c, a, s) * rng.lognormal(0, 0.08))
    cells, _ = P.read_stage1(_write(tmp_path, rows))
    ts = P.tests(cells)
    m = {"not worse": P.M_NOT_WORSE, "no more bytes": P.M_BYTES, "beats both": P.M_BEATS}
    kinds = set()
    for t in ts:
        assert t.cleared == (t.p < P.ALPHA / 2 / m[t.family]), t
        if t.cleared:
            assert t.p_holm < P.ALPHA / 2
        kinds.add(t.status().split(" at ")[0])
    assert "clears" in kinds and "not shown" in kinds  # the scenario exercises both sides


def test_holm_alone_claims_nothing():
    t = P.Test("not worse", "cell=A", "learner", "AUC", 1.0, 0.85, 1.2, 20, 0.0004, 0.9, True,
               p_holm=0.01)  # fmt: skip
    assert not t.cleared and t.status() == "Holm only, not claimed"
    assert P.Test(**{**t.__dict__, "low": 0.91}).status() == "clears"
    assert P.Test(**{**t.__dict__, "low": 0.5, "high": 0.8}).status() == "clear miss"


def test_an_interval_at_n_2_prints_its_ends_readably():
    """At n = 2 (one degree of freedom) the interval at 1 - 0.05/48 ends at 1e-22 and 1e21: the
    page printed the upper end as 22 digits with separators; now in scientific notation."""
    t = P.Test("not worse", "cell=A", "learner", "AUC", 1.09, 4.07e-22, 2.895e21, 2, 0.13, 0.9,
               True)  # fmt: skip
    assert t.interval_text() == "1.09 [4.07e-22, 2.9e+21]"
    wide = P.Test(**{**t.__dict__, "low": 0.95, "high": 123456.0})
    assert wide.interval_text() == "1.09 [0.95, 123,456]"  # thousands separators below 10**9


def test_a_clear_miss_is_reported_as_one_and_the_headline_falls_back(tmp_path):
    """Thinned at half the learner arm's AUC and 30 s later to target; buffer at 0.6x: thinned
    is worse on both outcomes against the learner arm, and the headline names the learner arm
    by the descriptive buffer / learner ratio."""
    level = lambda c, a: {"learner": 400, "buffer": 240, "thinned": 200}[a]  # noqa: E731
    rng = np.random.default_rng(2)
    time = lambda c, a, s: (90.0 if a == "thinned" else 60.0) + rng.normal(0, 1)  # noqa: E731
    cells, _ = P.read_stage1(_write(tmp_path, _rows(noisy(level), time=time)))
    v = P.verdicts(P.tests(cells))
    assert "AUC against learner" in v["cell=A"]["not worse"]
    assert "time to target against learner" in v["cell=A"]["not worse"]
    assert v["cell=A"]["not worse"].startswith("worse: ")
    assert all(v[c]["beats both"] == "loses to learner and buffer" for c in P.CAPPED)
    pick, why = P.placement_to_use(cells, P.tests(cells))["cell=B"]
    assert pick == "learner" and "descriptive" in why


def test_interim_until_every_cell_has_its_seeds(tmp_path):
    level = lambda c, a: 400.0  # noqa: E731
    rows = _rows(noisy(level), drop={("cell=M", "thinned", 19)})
    cells, _ = P.read_stage1(_write(tmp_path, rows))
    assert not P.all_seeds_in(cells) and P.seeds_run(cells["cell=M"]) == 19
    page = P.stage1_section(tmp_path)
    assert "**Interim**" in page and "interim, not decided" in page
    assert f"{len(rows)} of 450 runs" in page
    # no rows: says so, and nothing else
    (tmp_path / "runs.csv").unlink()
    assert P.stage1_section(tmp_path).startswith("Stage 1 has not run yet: 0 of 450 runs")


def test_no_more_bytes_is_against_both_arms(tmp_path):
    """At rho 0.25 the buffer arm ships less than the learner arm: thinned at 1.5x the buffer's
    MB (0.375x the learner's) is a clear miss against the buffer, so not "no more bytes"."""
    mb = lambda c, a: {"learner": 80.0, "buffer": 20.0, "thinned": 30.0}[a]  # noqa: E731
    cells, _ = P.read_stage1(_write(tmp_path, _rows(noisy(lambda c, a: 400.0), mb=mb)))
    ts = P.tests(cells)
    b = {t.against: t for t in ts if t.family == "no more bytes" and t.cell == "cell=B"}
    assert b["buffer"].estimate == pytest.approx(1.5, rel=0.02) and b["buffer"].missed
    assert b["learner"].cleared and P.cheaper(cells["cell=B"]) == "buffer"
    assert P.verdicts(ts)["cell=B"]["no more bytes"] == "more bytes than buffer"
    # one Holm p per cell's claim, on both its rows
    assert b["buffer"].p_holm == b["learner"].p_holm


def test_time_to_target_is_uninformative_without_a_target_or_a_hit(tmp_path):
    """No run reaches the target in the capped cells (every restricted time is T, a difference
    of 0 by construction), and cell M's env has none: those time tests neither clear nor miss,
    carry no p into Holm, and the cells are judged on their AUC tests."""
    capped_never = lambda c, a, s: None if c in P.CAPPED else 60.0 + s * 0.1 + (a == "buffer")  # noqa: E731
    rows = _rows(noisy(lambda c, a: 400.0), time=capped_never)
    for r in rows:
        if r["cell"] == "cell=M":
            r["target"], r["reached"] = math.nan, False
    cells, _ = P.read_stage1(_write(tmp_path, rows))
    ts = P.tests(cells)
    t = {(x.cell, x.against): x for x in ts if x.outcome == "time to target"}
    never = t[P.CAPPED[0], "learner"]
    assert never.uninformative == "neither arm reached the target by T" and math.isnan(never.p)
    assert not never.cleared and not never.missed and never.status() == never.uninformative
    assert t["cell=M", "buffer"].uninformative == "no target for this env"
    assert t["cell=A", "learner"].cleared and not t["cell=A", "learner"].uninformative
    v = P.verdicts(ts)
    assert v["cell=M"]["not worse"] == (
        "not worse than either (time to target: no target for this env)"
    )
    assert v["cell=A"]["not worse"] == "not worse than either"


def test_tau_and_the_margin_are_the_planned_t_and_a_short_run_is_listed(tmp_path):
    """One learner run of cell A stopped at 30 s: the cell's tau stays 135 s (the margin
    13.5 s), that run counts as not reached, and the section lists it."""
    late = lambda c, a, s: 60.0 + s * 0.1 + (40.0 if a == "thinned" else 0.0)  # noqa: E731
    rows = _rows(noisy(lambda c, a: 400.0), time=late)
    for r in rows:
        if r["cell"] == "cell=A" and r["replay_at"] == "learner" and r["seed"] == 3:
            r["T"], r["reached"], r["time_to_target_s"] = 30.0, False, 30.0
    cells, _ = P.read_stage1(_write(tmp_path, rows))
    t = {(x.cell, x.against): x for x in P.tests(cells) if x.outcome == "time to target"}
    assert t["cell=A", "learner"].margin == t["cell=A", "buffer"].margin == 13.5
    assert t["cell=A", "learner"].missed and t["cell=A", "buffer"].missed  # 40 s later
    assert P.short_runs(cells) == ["cell=A learner seed 3 (T 30 s)"]
    assert "cell=A learner seed 3 (T 30 s)" in P.stage1_section(tmp_path)


def test_auto_choices_come_from_the_run_folders(tmp_path, monkeypatch):
    """The auto checks' folders as mpirl.sweep names them from auto.toml and auto-M.toml (a
    label "100,0.25" becomes cell=100-0.25); a set-aside folder is not a check; a cell without
    one is named."""
    from mpirl.sweep import expand, load_spec

    root = P.ROOT / "experiments" / "placement-3"
    monkeypatch.chdir(tmp_path)
    runs = [r for f in ("auto.toml", "auto-M.toml") for r in expand(load_spec(root / f))]
    assert len(runs) == 12
    for i, r in enumerate(runs[:-1]):  # every check but the last (M)
        r.run_dir.mkdir(parents=True)
        with h5py.File(r.run_dir / "learner.h5", "w") as f:
            pick = "buffer" if i == 9 else "learner"  # the tenth is cell A
            f.attrs["replay_at_auto_json"] = json.dumps(
                {"replay_at": pick, "confidence": "measured", "why": "the bytes rule"}
            )
    aside = runs[0].run_dir.with_name("seed0.incomplete-1")
    aside.mkdir()
    with h5py.File(aside / "learner.h5", "w") as f:
        f.attrs["replay_at_auto_json"] = json.dumps({"replay_at": "thinned"})
    rows, missing = P.auto_choices(tmp_path / "runs" / "placement-3" / "auto")
    got = {r["cell"]: r["replay_at"] for r in rows}
    assert len(got) == 11 and missing == ["cell=M"]
    assert got["cell=A"] == "buffer" and got["bandwidth_mbps=100, rho=0.25"] == "learner"
    data = tmp_path / "data"
    P.write_auto(rows, data)
    P.write_auto([{"cell": "cell=A", "replay_at": "thinned"}], data)  # a later check replaces
    level = lambda c, a: {"learner": 400, "buffer": 200, "thinned": 400}[a]  # noqa: E731
    _write(data, _rows(noisy(level)))
    cells, auto = P.read_stage1(data)
    assert auto["cell=A"] == "thinned" and auto["cell=B"] == "learner"
    page = P.stage1_section(data)
    assert "| thinned (same) |" in page and "| learner (differs) |" in page
    assert P.main(["--auto", str(tmp_path / "runs" / "placement-3" / "auto"), "--data",
                   str(data)]) == 1  # fmt: skip


def test_a_forest_plot_per_family(tmp_path):
    pytest.importorskip("matplotlib")
    level = lambda c, a: {"learner": 400, "buffer": 200, "thinned": 400}[a]  # noqa: E731
    data = _write(tmp_path, _rows(noisy(level)))
    paths = P.stage1_figures(data, tmp_path / "fig")
    assert [p.name for p in paths] == [f"{n}.png" for n in P.FAMILY_FILES.values()]
    assert all(p.stat().st_size > 10_000 for p in paths)
    assert P.stage1_figures(tmp_path / "empty", tmp_path / "none") == []


def test_holm_counts_the_planned_family_while_cells_run(tmp_path):
    """Only cell A has run: Holm's m is still the planned 48 (the missing tests count as p = 1),
    so the smallest p is multiplied by 48, not by A's 4 (the interim table read "Holm only"
    where the final family would not)."""
    rows = [r for r in _rows(noisy(lambda c, a: 400.0)) if r["cell"] == "cell=A"]
    cells, _ = P.read_stage1(_write(tmp_path, rows))
    nw = [t for t in P.tests(cells) if t.family == "not worse" and t.cell == "cell=A"]
    best = min(nw, key=lambda t: t.p)
    assert best.p_holm == pytest.approx(min(1.0, 48 * best.p))
