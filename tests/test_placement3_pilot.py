"""experiments/placement3_pilot.py (stage 0 of experiments/placement-3/plan.md): its two rules on
synthetic exported rows, and docs/results.md's generated section is what the committed rows
give."""

import csv
import importlib.util
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
mod = importlib.util.spec_from_file_location(
    "placement3_pilot", ROOT / "experiments" / "placement3_pilot.py"
)
P = importlib.util.module_from_spec(mod)
sys.modules["placement3_pilot"] = P
mod.loader.exec_module(P)


def _write(tmp: Path, curves_of, auc_of) -> Path:
    """Three seeds x three arms in two cells (rho 0.25 at T 360 s, rho 1 at T 135 s);
    ``curves_of(cell, arm)`` -> return as a function of t, ``auc_of(cell, arm)`` -> AUC."""
    cells = {"cell=1.25-0.25": (46.875, 360.0), "cell=1.25-1": (187.5, 135.0)}
    rows, pts = [], []
    for c, (u, big_t) in cells.items():
        for arm in P.ARMS:
            for s in (100, 101, 102):
                run = f"runs/p/{c}/replay_at={arm}/seed{s}"
                rows.append(
                    {"run": run, "cell": c, "replay_at": arm, "seed": s, "T": big_t,
                     "P_requested": 12000, "U_requested": u, "U": u,
                     "auc_return": auc_of(c, arm) * (1 + 0.01 * (s - 101)), "link_mb": 10.0,
                     "delivered_fraction": 0.5, "batch_td": 2.0, "uniform_td": 1.0,
                     "load_max": 1.5}
                )  # fmt: skip
                f = curves_of(c, arm)
                pts += [{"run": run, "t": t, "return": f(t)} for t in np.linspace(0, big_t, 241)]
    for name, table in (("runs.csv", rows), ("curves.csv", pts)):
        with open(tmp / name, "w", newline="") as fh:
            w = csv.DictWriter(fh, list(table[0]))
            w.writeheader()
            w.writerows(table)
    return tmp


def flat_early(t):
    return min(500.0, 500.0 * t / 30)


def test_t_is_the_first_candidate_where_every_arm_flattened(tmp_path):
    """rho 0.25: thinned still rises 5.3% at the map's 240 s (saturating at 150 s), flat at
    1.25x = 300 s; rho 1: every arm flat at the map's 90 s."""
    slow = lambda t: min(500.0, 500.0 * t / 150)  # noqa: E731
    curves = lambda c, a: slow if (a == "thinned" and c.endswith("0.25")) else flat_early  # noqa: E731
    rows, cv = P.read(_write(tmp_path, curves, lambda c, a: 400.0))
    got = P.choose_t(rows, cv)
    assert got[0.25]["T"] == 300.0 and got[1.0]["T"] == 90.0
    assert got[0.25]["g"][(1.0, "cell=1.25-0.25", "thinned")] == pytest.approx(500 / 475, rel=0.01)
    text = P.markdown(rows, cv, 18)
    assert "rho 0.25: **T = 300 s**" in text and "rho 1: **T = 90 s**" in text


def test_a_curve_that_never_flattens_keeps_one_and_a_half_times_and_says_so(tmp_path):
    rising = lambda t: 1.0 + t  # noqa: E731
    rows, cv = P.read(_write(tmp_path, lambda c, a: rising, lambda c, a: 400.0))
    assert P.choose_t(rows, cv)[1.0]["T"] is None
    assert "rho 1: **not flattened at 1.5x the map's T**; stage 1 runs at 135 s" in P.markdown(
        rows, cv, 18
    )


def test_stage_one_runs_only_if_thinned_holds_four_fifths_of_the_learner_arm(tmp_path):
    ok = P.read(
        _write(tmp_path, lambda c, a: flat_early, lambda c, a: 400.0 if a != "thinned" else 330.0)
    )
    s = P.stage1(ok[0])
    assert s["runs"] and s["ratios"]["cell=1.25-1"] == pytest.approx(330 / 400)
    assert "**Stage 1 runs**" in P.markdown(*ok, 18)
    (tmp_path / "b").mkdir()
    low = P.read(
        _write(tmp_path / "b", lambda c, a: flat_early,
               lambda c, a: 310.0 if (a == "thinned" and c.endswith("-1")) else 400.0)
    )  # fmt: skip
    s = P.stage1(low[0])
    assert not s["runs"] and s["complete"]
    assert "**Stage 1 does not run**" in P.markdown(*low, 18) and "cell=1.25-1" in P.markdown(
        *low, 18
    )


def test_fewer_runs_than_planned_apply_no_rule(tmp_path):
    """Until all of the spec's runs are in, the section shows the figures and no answer."""
    rows, cv = P.read(_write(tmp_path, lambda c, a: flat_early, lambda c, a: 400.0))
    text = P.markdown(rows, cv, 27)
    assert text.startswith("**Interim: 18 of the 27 pilot runs.**")
    assert "**T =" not in text and "**Stage 1" not in text
    assert P.planned() == 27


def test_the_pilot_spec_is_what_the_rules_read():
    """pilot.toml: T = 1.5x the map's in each cell, the three arms, rows exported where the
    script reads them."""
    from mpirl.sweep import expand, load_spec

    spec = load_spec(ROOT / "experiments" / "placement-3" / "pilot.toml")
    assert spec.export is not None and (ROOT / spec.export).resolve() == P.DATA.resolve()
    assert [lab for lab, _ in spec.axes["replay_at"]] == list(P.ARMS)
    for _, flags in spec.axes["cell"]:
        rho = flags["learner_updates_per_s"] * P.BATCH / (3000 * 4)
        assert (
            flags["max_seconds"]
            == P.MAP_T[P.rho_of({"U_requested": rho * 12000 / 64, "P_requested": 12000})] * 1.5
        )
    assert len(expand(spec)) == 27


def test_committed_section_is_what_the_committed_rows_give():
    p = subprocess.run(
        [sys.executable, "experiments/placement3_pilot.py", "--check", "docs/results.md"],
        cwd=ROOT, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr + p.stdout[-500:]


def test_stage1_specs_follow_the_plan_and_the_pilot():
    """experiments/placement-3/{map,A,B,M}.toml as plan.md says: three arms with the same flags
    but --replay-at, 10 seeds in map cells and 20 in A, B, M, the evaluation cadence of every
    placement 2 s (M: 10), and T from the pilot's rule 1 as the committed rows give it (none
    flattened: 1.5x the map's T); auto.toml checks auto's choice once per CartPole cell."""
    from mpirl import sweep as S

    root = P.ROOT / "experiments" / "placement-3"
    rows, curves = P.read(P.DATA)
    chosen = P.choose_t(rows, curves)
    t = {rho: res["T"] or P.MAP_T[rho] * P.CANDIDATES[-1] for rho, res in chosen.items()}
    want_t = {"0.25": t[0.25], "1": t[1.0], "4": P.MAP_T[4.0] * P.CANDIDATES[-1]}
    for name, seeds in (("map", 10), ("A", 20), ("B", 20), ("M", 20)):
        spec = S.load_spec(root / f"{name}.toml")
        runs = S.expand(spec)
        assert S.check(spec, runs) == [], name
        assert len(spec.seeds) == seeds and str(spec.export) == "docs/results/data/placement-3"
        by_arm: dict = {}
        for run in runs:
            f = dict(run.flags)
            by_arm.setdefault(f.pop("replay_at"), []).append(tuple(sorted(f.items())))
            assert f["eval_every_s"] == (10 if name == "M" else 2), name
            assert f["max_updates"] == 0 and f["target_return"] == "none"
            if name == "map":
                rho = {46.875: "0.25", 187.5: "1", 750: "4"}[f["learner_updates_per_s"]]
                assert f["max_seconds"] == want_t[rho], (name, rho)
        assert set(by_arm) == {"learner", "buffer", "thinned"}, name
        assert by_arm["learner"] == by_arm["buffer"] == by_arm["thinned"], name  # but --replay-at
    assert S.expand(S.load_spec(root / "A.toml"))[0].flags["max_seconds"] == want_t["1"]
    assert S.expand(S.load_spec(root / "B.toml"))[0].flags["max_seconds"] == want_t["0.25"]
    auto = S.expand(S.load_spec(root / "auto.toml"))
    assert len(auto) == 11 and {r.flags["replay_at"] for r in auto} == {"auto"}
