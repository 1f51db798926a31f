"""experiments/weights-delta/*.toml (the weights-encoding learning comparison) are valid sweeps of
paired seeds, and their analysis reads the sweep's folders."""

import importlib.util
from pathlib import Path

from mpirl import sweep as S

ROOT = Path(__file__).resolve().parents[1]


def test_spec_pairs_full_and_delta_per_seed():
    stage1 = set()
    cells = (("cartpole", 20), ("minatar", 10), ("cartpole-confirm", 30), ("minatar-fixed", 10))
    for name, seeds in cells:  # power
        spec = S.load_spec(ROOT / "experiments" / "weights-delta" / f"{name}.toml")
        runs = S.expand(spec)
        assert S.check(spec, runs) == []
        assert len(spec.seeds) == seeds and list(spec.axes)[-1] == "weights_encoding"
        assert [lab for lab, _ in spec.axes["weights_encoding"]] == ["full", "delta"]
        assert [lab for lab, _ in spec.axes["env"]] == [name]
        assert len(runs) == len(spec.seeds) * 2
        want = "weights-delta-fixed" if name == "minatar-fixed" else "weights-delta"
        assert Path(spec.out).parts[-2:] == ("runs", want)  # the fixed cell: its own root
        if name == "cartpole":
            stage1 = set(spec.seeds)
        if name == "cartpole-confirm":  # a fresh confirmatory run: no seed of the first stage
            assert not stage1 & set(spec.seeds)


def test_fixed_cell_broadcasts_equally_often_in_both_encodings():
    """minatar-fixed.toml is the auto MinAtar cell with one difference: a fixed --weights-every,
    the same for both encodings (the auto cell gave delta ~3x the broadcasts), that full weights
    can sustain within the auto cells' 0.25 link share."""
    load = S.load_spec
    fixed = load(ROOT / "experiments" / "weights-delta" / "minatar-fixed.toml")
    auto = load(ROOT / "experiments" / "weights-delta" / "minatar.toml")
    runs = S.expand(fixed)
    every = {r.cell["weights_encoding"]: str(r.flags["weights_every"]) for r in runs}
    assert set(every) == {"full", "delta"} and len(set(every.values())) == 1
    n = int(every["full"])  # a number of updates, not "auto"
    assert all(f"--weights-every {n}" in " ".join(r.command(fixed)) for r in runs)
    assert str(auto.flags["weights_every"]) == "auto"
    (_, env), (_, env_auto) = fixed.axes["env"][0], auto.axes["env"][0]
    assert env == env_auto and fixed.seeds == auto.seeds  # the same cell, seeds, budget, link
    assert {k: v for k, v in fixed.flags.items() if k != "weights_every"} == {
        k: v for k, v in auto.flags.items() if k not in ("weights_every", "weights_link_share")
    }
    assert fixed.budget == auto.budget and fixed.ranks == auto.ranks
    full_s = 528_756 * 8 / (env["bandwidth_mbps"] * 1e6)  # a full broadcast on the wire
    assert full_s / (n / env["learner_updates_per_s"]) <= auto.flags["weights_link_share"]


def test_minatar_decision_is_pending_until_the_fixed_cell_has_its_pairs():
    """With minatar-fixed planned, the auto MinAtar cell is reported as a cadence comparison and
    no longer decides: the verdict says the MinAtar decision is pending while the fixed cell has
    no rows (or too few), and follows the fixed cell once it has its pairs."""
    mod = importlib.util.spec_from_file_location(
        "weights_delta", ROOT / "experiments" / "weights_delta.py"
    )
    wd = importlib.util.module_from_spec(mod)
    mod.loader.exec_module(wd)
    assert wd.FIXED == {"minatar-fixed": "minatar"} and wd.planned()["minatar-fixed"] == 10

    def rows(env, n, factor, link=(17.7, 15.1)):
        return [
            {
                "env": env,
                "encoding": enc,
                "seed": s,
                **dict.fromkeys(wd.FIELDS[3:], 1.0),
                "link_mb": link[enc == "delta"],
                "return": (100.0 + s) * (factor * (1.02, 0.98)[s % 2] if enc == "delta" else 1),
            }
            for s in range(n)
            for enc in ("full", "delta")
        ]

    plan = {"cartpole-confirm": 4, "minatar": 4, "minatar-fixed": 4}
    done = rows("cartpole-confirm", 4, 1.0) + rows("minatar", 4, 1.3)  # auto: clearly better
    text = wd.markdown(wd.summarize(done), plan)
    last = text.splitlines()[-1]
    assert last.startswith("Interim, not decided") and "minatar-fixed" in last.split(".")[0]
    assert "minatar-fixed: not yet run, so the minatar decision is pending" in last
    assert "minatar: at --weights-every auto, a cadence comparison, not the decision" in last
    assert "| minatar-fixed | 0 of 4 | not yet run |" in text
    assert "| 17.7 / 15.1 |" in text  # the link MB a run, full / delta
    some = done + rows("minatar-fixed", 2, 1.0)
    last = wd.markdown(wd.summarize(some), plan).splitlines()[-1]
    assert last.startswith("Interim") and "minatar-fixed: 2 of 4 pairs so far" in last
    ok = done + rows("minatar-fixed", 4, 1.0)
    last = wd.markdown(wd.summarize(ok), plan).splitlines()[-1]
    assert last.startswith("**delta is not worse than full weights in every cell**"), last
    worse = done + rows("minatar-fixed", 4, 0.8)  # the auto cell's 1.3 no longer rescues it
    last = wd.markdown(wd.summarize(worse), plan).splitlines()[-1]
    assert last.startswith("**delta is not shown"), last
    # rows without link bytes (an older CSV) show "-"
    old = [{**r, "link_mb": float("nan")} for r in done]
    assert "| - / - |" in wd.markdown(wd.summarize(old), plan)


def test_analysis_finds_cells(tmp_path):
    mod = importlib.util.spec_from_file_location(
        "weights_delta", ROOT / "experiments" / "weights_delta.py"
    )
    wd = importlib.util.module_from_spec(mod)
    mod.loader.exec_module(wd)
    for enc in ("full", "delta"):
        for seed in (0, 1):
            d = tmp_path / f"env=minatar,weights_encoding={enc}" / f"seed{seed}"
            d.mkdir(parents=True)
            (d / "summary.json").write_text("{}")
    (tmp_path / "env=minatar,weights_encoding=delta" / "seed2").mkdir()  # unfinished: skipped
    cells = wd.cells(tmp_path)
    assert sorted(cells) == ["minatar"] and sorted(cells["minatar"]["delta"]) == [0, 1]


def test_verdict_is_a_t_interval_on_paired_log_ratios(tmp_path, monkeypatch):
    """Ten seeds whose delta run returns 0.95x its full run, +-2%: not worse (lower end > 0.9);
    at 0.85x it is not, and the interval is the paired t-interval, not a bootstrap."""
    mod = importlib.util.spec_from_file_location(
        "weights_delta", ROOT / "experiments" / "weights_delta.py"
    )
    wd = importlib.util.module_from_spec(mod)
    mod.loader.exec_module(wd)
    for enc in ("full", "delta"):
        for seed in range(10):
            d = tmp_path / f"env=cartpole,weights_encoding={enc}" / f"seed{seed}"
            d.mkdir(parents=True)
            (d / "summary.json").write_text("{}")
    noise = [1.02, 0.98] * 5
    for factor, verdict in ((0.95, True), (0.85, False)):

        def figures(d, factor=factor):
            seed = int(d.name[4:])
            base = 100.0 + 10 * seed
            ret = base * factor * noise[seed] if "delta" in d.parent.name else base
            return {**dict.fromkeys(wd.FIELDS[3:], 1.0), "return": ret, "final_return": ret}

        monkeypatch.setattr(wd, "run_figures", figures)
        r = wd.analyse(tmp_path)["cartpole"]
        assert r["n"] == 10 and r["not_worse"] is verdict
        wd.write_rows(tmp_path / "rows.csv", wd.rows(tmp_path))  # the committed form
        again = wd.summarize(wd.read_rows(tmp_path / "rows.csv"))["cartpole"]
        assert again["not_worse"] is verdict and abs(again["low"] - r["low"]) < 1e-5
        res = wd.summarize(wd.read_rows(tmp_path / "rows.csv"))
        interim = wd.markdown(res, {"cartpole": 20}).splitlines()[-1]
        assert interim.startswith("Interim") and "cartpole: 10 of 20 pairs so far" in interim
        both = wd.markdown(res, {"cartpole": 10, "minatar": 10}).splitlines()[-1]
        assert both.startswith("Interim") and "minatar: no pairs yet" in both
        text = wd.markdown(res, {"cartpole": 10})
        assert ("**delta is not worse" in text) is verdict and "| cartpole | 10 of 10 |" in text
        page = tmp_path / "page.md"
        marks = "<!-- BEGIN generated: weights_delta -->\n<!-- END generated: weights_delta -->"
        page.write_text(f"a\n{marks}\n")
        from analysis.verdict import replace_section

        assert text in replace_section(page.read_text(), "weights_delta", text)
        assert abs(r["ratio"] - factor) < 0.01
        # t(0.975, 9) = 2.262; sd of log(noise) = 0.0211 -> half-width exp(+-0.0151)
        assert abs(r["low"] / r["ratio"] - 0.985) < 0.002
    assert wd.planned() == {
        "cartpole": 20,
        "cartpole-confirm": 30,
        "minatar": 10,
        "minatar-fixed": 10,
    }


def test_committed_table_is_what_the_committed_rows_give():
    """docs/benchmarks.md's generated weights_delta section equals what
    docs/results/data/weights-delta/runs.csv gives (python experiments/weights_delta.py
    docs/results/data/weights-delta/runs.csv --update docs/benchmarks.md)."""
    import subprocess
    import sys

    p = subprocess.run(
        [
            sys.executable,
            "experiments/weights_delta.py",
            "docs/results/data/weights-delta/runs.csv",
            "--check",
            "docs/benchmarks.md",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]


def test_rows_csv_merges_sittings(tmp_path):
    """--csv merges: a sitting's runs replace their own rows and keep every other row, so rows
    whose run folders went with an earlier machine are not lost (they were, when it overwrote)."""
    mod = importlib.util.spec_from_file_location(
        "weights_delta", ROOT / "experiments" / "weights_delta.py"
    )
    wd = importlib.util.module_from_spec(mod)
    mod.loader.exec_module(wd)

    def row(enc, seed, ret):
        return {
            "env": "minatar",
            "encoding": enc,
            "seed": seed,
            **dict.fromkeys(wd.FIELDS[3:], 1.0),
            "return": ret,
        }

    path = tmp_path / "runs.csv"
    wd.write_rows(path, [row("full", 0, 10.0), row("delta", 0, 11.0)])  # first sitting
    wd.write_rows(path, [row("full", 1, 12.0), row("delta", 0, 13.0)])  # second: seed 0 rerun
    got = {(r["encoding"], r["seed"]): r["return"] for r in wd.read_rows(path)}
    assert got == {("full", 0): 10.0, ("delta", 0): 13.0, ("full", 1): 12.0}
    assert [(r["encoding"], r["seed"]) for r in wd.read_rows(path)] == sorted(got)


def test_a_confirmatory_cell_decides_and_its_first_stage_is_a_pilot():
    """With cartpole-confirm planned, the first-stage cartpole cell is reported but no longer
    decides: the verdict waits for the confirmatory pairs and then follows them alone."""
    mod = importlib.util.spec_from_file_location(
        "weights_delta", ROOT / "experiments" / "weights_delta.py"
    )
    wd = importlib.util.module_from_spec(mod)
    mod.loader.exec_module(wd)
    assert wd.CONFIRMS == {"cartpole-confirm": "cartpole"}
    plan = wd.planned()
    assert plan["cartpole-confirm"] == 30 and plan["cartpole"] == 20

    def rows(env, n, factor, seed0=0):
        return [
            {
                "env": env,
                "encoding": enc,
                "seed": seed0 + s,
                **dict.fromkeys(wd.FIELDS[3:], 1.0),
                "return": (100.0 + s) * (factor * (1.02, 0.98)[s % 2] if enc == "delta" else 1),
            }
            for s in range(n)
            for enc in ("full", "delta")
        ]

    stage1 = rows("cartpole", 4, 0.8) + rows("minatar", 4, 1.0)
    small = {"cartpole": 4, "minatar": 4, "cartpole-confirm": 4}
    text = wd.markdown(wd.summarize(stage1), small).splitlines()[-1]
    assert text.startswith("Interim") and "cartpole-confirm: no pairs yet" in text
    assert "cartpole: first stage, n = 4" in text
    both = stage1 + rows("cartpole-confirm", 4, 1.0, seed0=20)
    text = wd.markdown(wd.summarize(both), small).splitlines()[-1]
    assert text.startswith("**delta is not worse than full weights in every cell**"), text
    worse = stage1 + rows("cartpole-confirm", 4, 0.8, seed0=20)
    text = wd.markdown(wd.summarize(worse), small).splitlines()[-1]
    assert text.startswith("**delta is not shown"), text
    # without the confirmatory cell in the plan, the first stage decides as before
    text = wd.markdown(wd.summarize(stage1), {"cartpole": 4, "minatar": 4}).splitlines()[-1]
    assert text.startswith("**delta is not shown") and "first stage" not in text


def test_the_load_column_is_the_highest_load_of_any_run():
    """ "load max" is the highest load average any run of the cell saw, not the median of the
    runs' maxima (which read 2.0 for the fixed MinAtar cell whose runs reached 7.1)."""
    mod = importlib.util.spec_from_file_location(
        "weights_delta", ROOT / "experiments" / "weights_delta.py"
    )
    wd = importlib.util.module_from_spec(mod)
    mod.loader.exec_module(wd)
    rows = []
    for seed in range(5):
        for enc in ("full", "delta"):
            rows.append(
                {
                    "env": "minatar", "encoding": enc, "seed": seed, "return": 1.0,
                    "final_return": 1.0, "return_window": 1.0, "T": 300.0, "updates": 3000,
                    "U": 10.0, "P": 2000.0, "evals": 10, "link_mb": 15.0,
                    "load_max": 7.1 if (seed, enc) == (3, "delta") else 1.0,
                    "weights_bytes": 1e5, "lag_median": 100.0,
                }
            )  # fmt: skip
    s = wd.summarize(rows)["minatar"]
    assert max(s["full_load_max"], s["delta_load_max"]) == 7.1
