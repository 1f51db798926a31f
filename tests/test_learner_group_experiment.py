"""experiments/learner-group/ (the learner group with a straggler that comes and goes): the spec
is a valid sweep of paired seeds, and experiments/learner_group.py's tests decide as its
intervals say, on synthetic rows."""

import importlib.util
import math
import sys
from pathlib import Path

import numpy as np
import pytest

from mpirl import sweep as S
from mpirl.run.config import parse_straggle

ROOT = Path(__file__).resolve().parents[1]
mod = importlib.util.spec_from_file_location(
    "learner_group_exp", ROOT / "experiments" / "learner_group.py"
)
lg = importlib.util.module_from_spec(mod)
sys.modules["learner_group_exp"] = lg
mod.loader.exec_module(lg)


def test_spec_runs_every_mode_per_seed_with_the_straggler_over_the_learning():
    spec = S.load_spec(lg.SPEC)
    runs = S.expand(spec)
    assert S.check(spec, runs) == []
    assert len(spec.seeds) >= 10 and len(runs) == 4 * len(spec.seeds)
    assert list(spec.axes) == ["learner_sync"]
    assert [lab for lab, _ in spec.axes["learner_sync"]] == list(lg.MODES)
    assert spec.flags["env"] == "CartPole-v1" and spec.flags["learners"] == 2
    big_t = spec.budget["max_seconds"]
    rank, ms, start, end = parse_straggle(spec.flags["straggle"])
    assert rank == 1 and ms > 0 and (start, end) == (5.0, 35.0) and end < big_t  # plan.md v2
    assert spec.flags["target_return"] == "none" and spec.flags["eval_every_s"] > 0
    assert spec.budget["max_updates"] == 0 and spec.budget["max_env_steps"] == 0  # equal time
    assert lg.planned() == len(spec.seeds)


def test_healthy_spec_is_the_family_without_the_straggler():
    """healthy.toml (plan.md, H5): the same flags and budget but --straggle, allreduce and switch,
    its seeds among the family's."""
    fam, ok = S.load_spec(lg.SPEC), S.load_spec(lg.HEALTHY)
    runs = S.expand(ok)
    assert S.check(ok, runs) == []
    assert [lab for lab, _ in ok.axes["learner_sync"]] == ["allreduce", "switch"]
    assert "straggle" not in ok.flags
    assert {k: v for k, v in fam.flags.items() if k != "straggle"} == ok.flags
    assert fam.budget == ok.budget and ok.ranks == fam.ranks
    assert len(ok.seeds) >= 10 and set(ok.seeds) <= set(fam.seeds)
    assert Path(ok.out).parent == Path(fam.out).parent != Path(".")


def _rows(n, ttt, auc=None, big_t=150.0):
    """``ttt``: {mode: function seed -> time to target (None: not reached)}."""
    out = []
    for mode in lg.MODES:
        for s in range(n):
            t = ttt[mode](s)
            out.append(
                {
                    "mode": mode,
                    "seed": s,
                    **dict.fromkeys(lg.FIELDS[2:], 1.0),
                    "T": big_t,
                    "reached": float(t is not None),
                    "ttt": big_t if t is None else t,
                    "auc_return": (auc or {}).get(mode, 300.0) * (1 + 0.01 * (s % 3)),
                    "updates_to_target": math.nan if t is None else 1000.0 * t,
                }
            )
    return out


def test_a_faster_mode_is_called_sooner_and_the_interval_agrees_with_p():
    jitter = [3.0, -2.0, 1.0, -1.5, 2.5, -3.0, 0.5, -0.5, 1.5, -2.5, 2.0, -1.0]
    ttt = {
        "allreduce": lambda s: 80.0 + 5 * jitter[s],
        "async": lambda s: 80.0 + 5 * jitter[s] + jitter[(s + 3) % 12],  # the same, noisily
        "gba": lambda s: 50.0 + 5 * jitter[s] + jitter[(s + 5) % 12],  # 30 s sooner
        "switch": lambda s: None if s == 0 else 55.0 + 5 * jitter[s],  # seed 0 never reached
    }
    res = lg.summarize(_rows(12, ttt))
    t = res["tests"]
    assert t["gba-allreduce"]["call"] == "sooner" and t["gba-allreduce"]["p_adj"] < 0.05
    assert abs(t["gba-allreduce"]["diff"] + 30) < 1.0
    assert t["async-allreduce"]["call"] == "no difference shown"
    assert t["switch-gba"]["n"] == 12
    for k, r in t.items():  # the decision and the interval never disagree
        outside = r["low"] > 0 or r["high"] < 0
        assert outside == (r["p_adj"] < 0.05), (k, r)
    # the interval is the paired t at 1 - 0.05/4, the p the paired t-test's x 4
    from scipy import stats

    d = np.array([ttt["async"](s) - ttt["allreduce"](s) for s in range(12)])
    half = stats.t.ppf(1 - 0.05 / 8, 11) * d.std(ddof=1) / math.sqrt(12)
    r = t["async-allreduce"]
    assert (r["low"], r["high"]) == pytest.approx((d.mean() - half, d.mean() + half))
    assert r["p_adj"] == pytest.approx(min(1.0, 4 * stats.ttest_1samp(d, 0).pvalue))
    # censored at tau: switch's seed 0 counts as 150 s, and its KM restricted mean is the mean
    sw = res["modes"]["switch"]
    assert sw["reached"] == 11 and sw["n"] == 12
    want = np.mean([150.0] + [55.0 + 5 * jitter[s] for s in range(1, 12)])
    assert sw["rmst"] == pytest.approx(want)
    text = lg.markdown(res, 12)
    assert "**gba reaches the target sooner than allreduce**" in lg.verdict(res, 12)
    assert lg.verdict(res, 12) in text
    assert "async against allreduce: no difference shown" in text
    assert "| switch | 12 | 11/12 |" in text


def test_a_slower_mode_is_called_later_and_short_comparisons_are_interim():
    ttt = {
        "allreduce": lambda s: 40.0 + s,
        "async": lambda s: None,  # never: censored at tau = 150 in every seed
        "gba": lambda s: 40.0 + s + (1.0 if s % 2 else -1.0),
        "switch": lambda s: 40.0 + s,
    }
    res = lg.summarize(_rows(10, ttt))
    assert res["tests"]["async-allreduce"]["call"] == "later"
    assert res["modes"]["async"]["median"] == math.inf
    assert "| async | 10 | 0/10 | 150.0 | > 150 |" in lg.markdown(res, 10)
    interim = lg.markdown(res, 16)
    assert lg.verdict(res, 16).startswith("Interim, not decided")
    assert "interim (10 of 16 pairs)" in interim and "**" not in lg.verdict(res, 16)
    # a mode with no runs yet
    some = [r for r in _rows(10, ttt) if r["mode"] != "switch"]
    text = lg.markdown(lg.summarize(some), 10)
    assert "| switch | 0 | - | not yet run |" in text
    assert lg.verdict(lg.summarize(some), 10).startswith("Interim")


def _healthy(n, ratio, spread):
    """No-straggler rows: switch's AUC = allreduce's x ratio x a per-seed factor."""
    wob = [1.0, -1.0, 0.5, -0.5, 0.0, 0.8, -0.8, 0.3, -0.3, 0.2, -0.2, 0.6]
    out = []
    for mode in ("allreduce", "switch"):
        for s in range(n):
            base = 400.0 + 10 * s
            auc = base * (ratio * math.exp(spread * wob[s]) if mode == "switch" else 1.0)
            out.append(
                {
                    "condition": "healthy",
                    "mode": mode,
                    "seed": s,
                    **dict.fromkeys(lg.FIELDS[2:], 1.0),
                    "T": 60.0,
                    "reached": 1.0,
                    "ttt": 20.0 + s,
                    "auc_return": auc,
                    "updates_to_target": 7000.0,
                }
            )
    return out


def test_h5_calls_equivalence_a_difference_or_inconclusive_by_its_intervals():
    """plan.md H5: equivalent when the 90% interval of the AUC ratio is inside [0.9, 1/0.9],
    a difference when the 95% interval excludes 1, else inconclusive; the family's rows and the
    no-straggler rows never mix."""
    fam = _rows(10, {m: (lambda s: 30.0 + s) for m in lg.MODES})
    same = lg.summarize(fam + _healthy(10, 1.0, 0.01))
    h = same["healthy"]
    assert h["n"] == 10 and h["equivalent"] and not h["differs"]
    assert 0.9 < h["auc_low90"] < 1 < h["auc_high90"] < 1 / 0.9
    assert same["tests"]["switch-allreduce"]["n"] == 10  # the family saw only its own rows
    text = lg.markdown(same, 10, 10)
    assert "**switch learns as allreduce does with no straggler**" in text
    worse = lg.summarize(fam + _healthy(10, 0.7, 0.01))["healthy"]
    assert worse["differs"] and not worse["equivalent"]
    assert "(less)" in "\n".join(lg.healthy_markdown(worse, 10))
    noisy = lg.summarize(fam + _healthy(10, 1.0, 0.3))["healthy"]
    assert not noisy["equivalent"] and not noisy["differs"]
    assert "inconclusive at n = 10" in lg.healthy_markdown(noisy, 10)[-1]
    assert "H5 interim" in lg.healthy_markdown(noisy, 12)[-1]
    # the 90% interval is log_ratio_t's
    from analysis.stats import log_ratio_t

    hr = _healthy(10, 1.0, 0.3)
    want = log_ratio_t(
        {r["seed"]: r["auc_return"] for r in hr if r["mode"] == "switch"},
        {r["seed"]: r["auc_return"] for r in hr if r["mode"] == "allreduce"},
        0.90,
    )
    assert (noisy["auc_low90"], noisy["auc_high90"]) == pytest.approx((want.low, want.high))


def test_rows_csv_round_trips_and_merges(tmp_path):
    ttt = {m: (lambda s: 30.0 + s) for m in lg.MODES}
    rows = _rows(3, ttt)
    path = tmp_path / "runs.csv"
    ok = _healthy(3, 1.0, 0.01)
    lg.write_rows(path, rows[:6])
    lg.write_rows(path, rows[6:] + ok)
    back = lg.read_rows(path)
    assert len(back) == len(rows) + len(ok) and {r["mode"] for r in back} == set(lg.MODES)
    assert sum(r["condition"] == "healthy" for r in back) == len(ok)
    got = lg.summarize(back)["modes"]["gba"]
    assert got["rmst"] == pytest.approx(31.0)
    page = tmp_path / "page.md"
    marks = "<!-- BEGIN generated: learner_group -->\n<!-- END generated: learner_group -->"
    page.write_text(f"a\n{marks}\n")
    lg.main([str(path), "--update", str(page)])
    assert "| gba - allreduce | 3 of" in page.read_text()
    lg.main([str(path), "--check", str(page)])  # unchanged: no exit


def test_phase_rates_count_updates_and_samples_in_each_phase():
    class Learner:
        def __init__(self):
            t = np.arange(0.0, 30.0, 0.01)  # 100 updates/s ...
            t = t[(t < 10) | (t >= 20) | (np.arange(t.size) % 4 == 0)]  # ... 25/s in [10, 20)
            self.streams = {
                "updates": {"t": t},
                "group": {"t": t, "samples": np.full(t.size, 128), "dropped": np.zeros(t.size)},
            }

        def stream(self, name):
            return self.streams.get(name, {})

    class Run:
        learner = Learner()

    r = lg.phase_rates(Run(), 30.0, 10.0, 20.0)
    assert r["ups_before"] == pytest.approx(100, rel=0.02)
    assert r["ups_during"] == pytest.approx(25, rel=0.02)
    assert r["ups_after"] == pytest.approx(100, rel=0.02)
    assert r["sps_during"] == pytest.approx(25 * 128, rel=0.02)
    no_window = lg.phase_rates(Run(), 30.0, math.inf, math.inf)
    assert math.isnan(no_window["ups_during"]) and math.isnan(no_window["ups_after"])


def test_analysis_finds_the_modes_of_the_sweep(tmp_path):
    for mode in lg.MODES:
        for seed in (0, 1):
            d = tmp_path / f"learner_sync={mode}" / f"seed{seed}"
            d.mkdir(parents=True)
            (d / "summary.json").write_text("{}")
    (tmp_path / "learner_sync=gba" / "seed2").mkdir()  # unfinished: skipped
    c = lg.cells(tmp_path)
    assert sorted(c) == sorted(lg.MODES) and sorted(c["gba"]) == [0, 1]
    assert lg.cells(tmp_path / "healthy") == {}  # a sweep not run yet


def test_the_specs_write_where_the_analysis_reads():
    """rows() reads ROOT/straggle and ROOT/healthy: the specs' out folders."""
    from mpirl.sweep import load_spec

    outs = [Path(load_spec(s).out) for s in (lg.SPEC, lg.HEALTHY)]
    assert [o.name for o in outs] == list(lg.CONDITIONS) and outs[0].parent == outs[1].parent


def test_committed_table_is_what_the_committed_rows_give():
    """docs/benchmarks.md's generated learner_group section equals what
    docs/results/data/learner-group/runs.csv gives (python experiments/learner_group.py
    docs/results/data/learner-group/runs.csv --update docs/benchmarks.md)."""
    import subprocess

    p = subprocess.run(
        [
            sys.executable,
            "experiments/learner_group.py",
            "docs/results/data/learner-group/runs.csv",
            "--check",
            "docs/benchmarks.md",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
