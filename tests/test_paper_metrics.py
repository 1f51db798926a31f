"""analysis: the paper experiment's metrics and the per-cell report, on small
synthetic HDF5 runs whose every value is computed by hand."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
from pathlib import Path

import h5py
import numpy as np
import pytest

from analysis import compare as C
from analysis import metrics as M
from analysis import paper as P
from analysis.cells import SLUG_MAX, group, slugify
from analysis.plots import curves
from analysis.runs import load_experiment, load_run

HAVE_MPL = importlib.util.find_spec("matplotlib") is not None


def write_run(
    path: Path,
    *,
    replay_at: str,
    seed: int,
    n_updates: int = 100,
    transfers: dict | None = None,
    ref: float = 1.0,
    prio: float = 1.0,
    hit_t: float | None = None,
    bytes_per_s: float = 1e5,
    max_seconds: float = 10.0,
    evals: dict | None = None,
    config: dict | None = None,
    env_steps: int = 640,
    wall_s: float = 10.0,
) -> Path:
    """A run folder as mpirl writes it, reduced to what analysis reads: the learner's loop
    starts at t = 0 (first /link row at t = 1 over 1 s); one /link row per second for 10 s;
    evaluations at t = 1..10 (updates 10..100) returning 500 from ``hit_t`` on, else 100."""
    path.mkdir(parents=True)
    u = np.arange(1, n_updates + 1)
    t_ev = np.arange(1.0, 11.0)
    streams = {
        "updates": {
            "t": u / 10.0,
            "update": u,
            "loss": np.where(u >= 50, 3.0, 1.0),
            "td_abs_mean": np.where(u >= 50, 0.5, 5.0),
        },
        "transfers": transfers
        or {
            "t": np.array([6.0]),
            "update": np.array([60]),
            "n": np.array([64]),
            "kind": np.array([4 if replay_at == "learner" else 5]),
            "nbytes": np.array([1000]),
            "priority_mean": np.array([prio]),
            "priority_median": np.array([prio]),
            "priority_p90": np.array([prio]),
            "arrival_td_mean": np.array([1.0]),
            "arrival_priority_mean": np.array([prio]),
            "arrival_n": np.array([64]),
        },
        "evals": evals
        or {
            "t": t_ev,
            "update": (t_ev * 10).astype(int),
            "env_steps": (t_ev * 1000).astype(int),
            "ret_mean": np.where(t_ev >= (hit_t or 99), 500.0, 100.0),
            "reference_loss": np.full(10, ref),
        },
        "link": {
            "t": t_ev,
            "bytes_in": np.full(10, bytes_per_s),
            "bytes_out": np.zeros(10),
            "interval_s": np.ones(10),
        },
    }
    cfg = {
        "env": "CartPole-v1",
        "replay_at": replay_at,
        "seed": seed,
        "max_seconds": max_seconds,
        "target_return": None,
        **(config or {}),
    }
    with h5py.File(path / "learner.h5", "w") as f:
        f.attrs["config_json"] = json.dumps(cfg)
        f.attrs["role"] = "learner"
        f.attrs["t0_unix"] = 1000.0
        for name, cols in streams.items():
            g = f.create_group(name)
            g.attrs["fields"] = list(cols)
            for k, v in cols.items():
                g[k] = np.asarray(v)
    total = float(np.sum(streams["link"]["bytes_in"]))
    (path / "summary.json").write_text(
        json.dumps(
            {
                "stop_reason": "max_seconds",
                "updates": n_updates,
                "wall_s": wall_s,
                "env_steps": env_steps,
                "link_bytes_in": total,
                "link_bytes_out": 0,
                "target_return": None,
            }
        )
    )
    return path


def test_run_metrics_by_hand(tmp_path):
    xf = {
        "t": np.array([1.0, 6.0, 8.0]),
        "update": np.array([10, 60, 80]),
        "n": np.array([100, 10, 30]),
        "nbytes": np.array([1, 100_000, 300_000]),
        "priority_mean": np.array([9.0, 1.0, 2.0]),
        "priority_median": np.array([9.0, 1.0, 3.0]),
        "priority_p90": np.array([9.0, 2.0, 5.0]),
        "arrival_td_mean": np.array([9.0, 1.0, 3.0]),
        "arrival_priority_mean": np.array([9.0, 2.0, 4.0]),
        "arrival_n": np.array([64, 10, 30]),
    }
    t = np.array([2.0, 4.0, 6.0, 8.0])
    ev = {
        "t": t,
        "update": np.array([25, 50, 75, 100]),
        "env_steps": np.array([1, 2, 3, 4]),
        "ret_mean": np.array([100.0, 480.0, 200.0, 500.0]),
        "reference_loss": np.array([9.0, 2.0, 4.0, 6.0]),
    }
    run = load_run(write_run(tmp_path / "r", replay_at="learner", seed=0, transfers=xf, evals=ev))
    m = M.run_metrics(run)
    assert m["window_start_update"] == 50  # N = 100 updates: the window is 50..100
    assert m["ref_loss"] == pytest.approx(4.0)  # (2 + 4 + 6) / 3: the eval at update 25 is out
    assert m["train_loss"] == pytest.approx(3.0) and m["batch_td"] == pytest.approx(0.5)
    assert m["prio_held"] == pytest.approx((10 * 1 + 30 * 2) / 40)  # per transition
    assert m["prio_per_mb"] == pytest.approx((10 * 1 + 30 * 2) / 400_000 * 1e6)  # 175
    assert m["prio_msg_median"] == pytest.approx(2.0)  # median of 1, 3
    assert m["prio_msg_p90"] == pytest.approx(3.5)  # median of 2, 5
    assert m["arrival_prio"] == pytest.approx((10 * 2 + 30 * 4) / 40)  # weighted by arrival_n
    assert m["link_mb"] == pytest.approx(1.0)  # 10 rows of 100 kB
    assert m["return_window"] == pytest.approx((480 + 200 + 500) / 3)
    assert m["return_per_mb"] == pytest.approx((480 + 200 + 500) / 3)
    # CartPole-v1's 475: first reached at t = 4, update 50, after 4 link rows (0.4 MB)
    assert (m["time_to_target_s"], m["updates_to_target"]) == (4.0, 50)
    assert m["link_mb_to_target"] == pytest.approx(0.4)
    assert m["delivered_fraction"] == pytest.approx(140 / 640)  # every row (no kind): forwarded
    # the settle rule's window beside it, transfers by time: the loss steps at update 50; its
    # 10-update moving average is within 20% of 3 from update 47 (t = 4.7) on, so the messages
    # at t = 6 and 8 count, as in the fixed window, and updates 47..49 (loss 1) join the mean
    assert (m["conv_method"], m["conv_update"], m["conv_t"]) == ("settled", 47, 4.7)
    assert m["train_loss_conv"] == pytest.approx((3 * 1.0 + 51 * 3.0) / 54)
    assert m["prio_held_conv"] == pytest.approx(m["prio_held"])
    assert m["transferred_conv"] == 40
    # an update budget in the config fixes the window, whatever the run reached
    run = load_run(
        write_run(
            tmp_path / "b",
            replay_at="learner",
            seed=0,
            transfers=xf,
            evals=ev,
            config={"max_updates": 160},
        )
    )
    m = M.run_metrics(run)
    assert m["window_start_update"] == 80 and m["ref_loss"] == pytest.approx(6.0)
    assert m["prio_held"] == pytest.approx(2.0)
    # cumulative link MB: 0 at the loop start, 0.1 MB at each second, linear in between
    assert M.link_mb_at(run, np.array([0.5, 1.5, 10.0])) == pytest.approx([0.05, 0.15, 1.0])


def test_delivered_fraction_counts_forwarded_messages_by_kind(tmp_path):
    """``/transfers/kind`` is the wire tag: only FORWARD messages count as delivered."""
    xf = {
        "t": np.array([6.0, 7.0]),
        "update": np.array([60, 70]),
        "n": np.array([64, 100]),
        "kind": np.array([int(M.Kind.FORWARD), int(M.Kind.BATCH)]),
        "priority_mean": np.ones(2),
    }
    run = load_run(write_run(tmp_path / "r", replay_at="learner", seed=0, transfers=xf))
    assert M.run_metrics(run)["delivered_fraction"] == pytest.approx(64 / 640)


def test_time_to_target_is_the_learners_record_when_it_stopped_there(tmp_path):
    """A run that stopped at its own target wrote the evaluation into its summary, on the
    training clock that also counts a resumed run's earlier segments; its rows from before the
    resume lie before this segment's loop start (negative t). Both reports take the summary's
    figures (the paper report stopped on a negative time before)."""
    t = np.array([-20.0, -5.0, 3.0])
    ev = {
        "t": t,
        "update": np.array([10, 50, 90]),
        "env_steps": np.array([100, 500, 900]),
        "ret_mean": np.array([100.0, 480.0, 500.0]),
        "reference_loss": np.ones(3),
    }
    root = tmp_path / "out"
    for place in ("learner", "buffer"):
        d = write_run(
            root / f"bandwidth_mbps=1,replay_at={place}" / "seed0",
            replay_at=place,
            seed=0,
            evals=ev,
            config={"target_return": 475.0},
            wall_s=30.0,
        )
        s = json.loads((d / "summary.json").read_text())
        s.update(
            target_return=475.0,
            stop_reason="target_return",
            time_to_target_s=25.0,
            env_steps_to_target=500,
            updates_to_target=50,
        )
        (d / "summary.json").write_text(json.dumps(s))
    runs, errors = load_experiment(root)
    assert not errors
    m = M.run_metrics(runs[0])
    assert (m["time_to_target_s"], m["env_steps_to_target"], m["updates_to_target"]) == (
        25.0,
        500,
        50,
    )
    over = M.run_metrics(runs[0], target=450.0)  # another target: the first eval above it
    assert (over["time_to_target_s"], over["updates_to_target"]) == (-5.0, 50)
    (cell,) = group(runs, root, by="sweep")
    c = P.analyse_cell(cell)
    assert c.ttt["learner"].times == (25.0,) and c.ttt["buffer"].times == (25.0,)


def sweep(root: Path, cells: dict) -> Path:
    """``cells``: {(bw, rho): {placement: [per-seed kwargs]}} as mpirl.sweep names folders."""
    for (bw, rho), places in cells.items():
        for place, seeds in places.items():
            for seed, kw in enumerate(seeds):
                write_run(
                    root / f"bandwidth_mbps={bw},rho={rho},replay_at={place}" / f"seed{seed}",
                    replay_at=place,
                    seed=seed,
                    config={"bandwidth_mbps": bw},
                    **kw,
                )
    return root


def test_cells_ratios_decision_and_crossover_by_hand(tmp_path):
    root = sweep(
        tmp_path / "out",
        {
            # the paper's figures: priority x3.5..4.5, reference loss x0.2..0.3; the proposed
            # placement reaches 475 at 1, 2, 5 s, the existing one at 2, 4 s and never (censored
            # at the 10 s budget): time ratios 0.5, 0.5, 0.5
            ("0.4", "1"): {
                "learner": [
                    dict(prio=1.0, ref=1.0, hit_t=2.0),
                    dict(prio=2.0, ref=2.0, hit_t=4.0),
                    dict(prio=4.0, ref=4.0, hit_t=None),
                ],
                "buffer": [
                    dict(prio=3.5, ref=0.2, hit_t=1.0, bytes_per_s=1e4),
                    dict(prio=8.0, ref=0.5, hit_t=2.0, bytes_per_s=1e4),
                    dict(prio=18.0, ref=1.2, hit_t=5.0, bytes_per_s=1e4),
                ],
            },
            # the opposite: priority x0.5 in every seed (a degenerate interval below 1)
            # ... where the existing placement delivers all production (64 transitions in 64 steps):
            # not a cell of the paper's regime
            ("100", "1"): {
                "learner": [
                    dict(prio=2.0, hit_t=3.0, env_steps=64),
                    dict(prio=4.0, hit_t=3.0, env_steps=64),
                ],
                "buffer": [dict(prio=1.0, hit_t=3.0), dict(prio=2.0, hit_t=3.0)],
            },
        },
    )
    runs, errors = load_experiment(root)
    assert not errors
    grouped = group(runs, root, by="sweep")
    assert [c.key for c in grouped] == [
        (("bandwidth_mbps", "0.4"), ("rho", "1")),
        (("bandwidth_mbps", "100"), ("rho", "1")),
    ]
    slow, fast = (P.analyse_cell(c) for c in grouped)
    p = slow.ratios["prio_held"]
    assert p.per_seed == pytest.approx((3.5, 4.0, 4.5))
    assert p.estimate == pytest.approx((3.5 * 4.0 * 4.5) ** (1 / 3))
    assert p.low <= 3.92 <= p.high and p.low > 1
    assert slow.ratios["ref_loss"].per_seed == pytest.approx((0.2, 0.25, 0.3))
    assert slow.decision.verdict == "reproduced"
    # priority per MB counts the messages toward the learner (64 transitions in 1000 B in
    # both), not the /link rows: the ratio is the priority ratio
    assert slow.ratios["prio_per_mb"].per_seed == pytest.approx((3.5, 4.0, 4.5))
    # return per MB: the window's (updates 50..100, t = 5..10) mean return over the run's link
    # MB (proposed 0.1, existing 1): 500/0.1 / (500/1) for seeds 0 and 1; seed 2's existing
    # run never reached 475, so 500/0.1 / (100/1)
    assert slow.ratios["return_per_mb"].per_seed == pytest.approx((10.0, 10.0, 50.0))
    # censored time to target
    assert slow.budget_s == 10.0
    tl, tb = slow.ttt["learner"], slow.ttt["buffer"]
    assert (tl.reached, tl.n, tl.median) == (2, 3, 4.0)
    assert (tb.reached, tb.median) == (3, 2.0)
    tr = slow.ratios["time_to_target"]
    assert tr.per_seed == pytest.approx((0.5, 0.5, 0.5)) and tr.method == "degenerate"
    assert slow.crossover["time to target"].startswith("proposed")
    assert slow.crossover["return per MB"].startswith("proposed")
    assert fast.decision.verdict == "refuted in this regime"
    assert fast.ratios["prio_held"].per_seed == pytest.approx((0.5, 0.5))
    assert fast.crossover["time to target"].startswith("no clear winner")
    assert fast.crossover["return per MB"].startswith("no clear winner")  # equal bytes

    # delivered: 64 forwarded transitions of 640 env steps in the slow cell, of 64 in the fast
    assert [m["delivered_fraction"] for m in slow.at("learner")] == [0.1, 0.1, 0.1]
    assert np.isnan(slow.at("buffer")[0]["delivered_fraction"])
    assert P.deciding(slow) and not P.deciding(fast)
    assert (
        P.headline([slow, fast])
        == "**reproduced** in every deciding cell (bandwidth_mbps=0.4, rho=1)"
    )
    assert P.headline([fast]).startswith("no cell is in the paper's regime")
    # a deciding cell that neither reproduces nor refutes: "inconclusive", not "holds only
    # where no deciding cell" (the pilot's report said that)
    slow.decision = dataclasses.replace(slow.decision, verdict="inconclusive")
    assert P.headline([slow, fast]) == (
        "**inconclusive**: no deciding cell reproduces it (bandwidth_mbps=0.4, rho=1: inconclusive)"
    )

    grid = P.crossover_map([slow, fast])
    assert grid.splitlines()[0] == "| bandwidth_mbps \\ rho | 1 |"
    assert grid.splitlines()[2].startswith("| 0.4 | time to target: proposed")


def test_a_run_that_stopped_early_is_censored_at_its_own_end(tmp_path):
    """Runs stop at their update budget, often long before --max-seconds: a seed that never
    reached the target is censored at its own run's end (4 s here), not at max_seconds (10 s),
    which would credit the other placement with a win the data do not show."""
    root = sweep(
        tmp_path / "out",
        {
            ("1.25", "1"): {
                "learner": [dict(hit_t=None, wall_s=4.0), dict(hit_t=None, wall_s=4.0)],
                "buffer": [dict(hit_t=6.0), dict(hit_t=8.0)],
            }
        },
    )
    runs, errors = load_experiment(root)
    assert not errors
    (cell,) = group(runs, root, by="sweep")
    c = P.analyse_cell(cell)
    assert c.ttt["learner"].reached == 0 and c.ttt["learner"].median_text() == "> 4"
    tr = c.ratios["time_to_target"]
    assert tr.per_seed == pytest.approx((6.0 / 4.0, 8.0 / 4.0))
    assert not c.crossover["time to target"].startswith("proposed")
    # updates to target: the same update budget in both, the failed seeds censored at it
    ur = c.ratios["updates_to_target"]
    assert ur.per_seed == pytest.approx((60 / 100, 80 / 100))
    table = P.cell_table(c)
    assert "| updates to target (censored at the run's updates) |" in table


def test_no_seed_reached_the_target_is_no_win_on_time(tmp_path):
    """MinAtar has no target: every seed of both placements is censored at its run's end, and a
    run 2 s shorter must not win the cell on time to target (it did before: 0.994 [0.992,
    0.998], "proposed")."""
    root = sweep(
        tmp_path / "out",
        {
            ("0.5", "1"): {
                "learner": [dict(hit_t=None, wall_s=10.0), dict(hit_t=None, wall_s=10.0)],
                "buffer": [dict(hit_t=None, wall_s=9.8), dict(hit_t=None, wall_s=9.9)],
            }
        },
    )
    runs, errors = load_experiment(root)
    assert not errors
    (cell,) = group(runs, root, by="sweep")
    c = P.analyse_cell(cell)
    assert c.crossover["time to target"].startswith("neither reached the target")
    assert c.ratios["time_to_target"].n == 0 and c.ratios["updates_to_target"].n == 0


def test_paper_report_writes_tables_and_plots(tmp_path):
    root = sweep(
        tmp_path / "out",
        {
            ("1", "4"): {
                "learner": [dict(prio=1.0, hit_t=2.0), dict(prio=1.0, hit_t=None)],
                "buffer": [dict(prio=2.0, hit_t=1.0), dict(prio=3.0, hit_t=3.0)],
            }
        },
    )
    rc = C.main(
        [str(root), "--out", str(tmp_path / "a"), "--report", str(tmp_path / "rep")]
        + ([] if HAVE_MPL else ["--no-plots"])
    )
    assert rc == 0
    md = (tmp_path / "rep" / "paper.md").read_text()
    assert "## Crossover map" in md and "## bandwidth_mbps=1, rho=4" in md
    assert (
        "| transferred priority, held by sender (window) | 0: 1.00, 1: 1.00 | 0: 2.00, 1: "
        "3.00 |" in md
    )
    # the existing placement: one seed censored at the 10 s budget; half reached by 2 s
    assert "| 0: 2.00, 1: n/a; reached 1/2, median 2 |" in md
    rows = (tmp_path / "rep" / "paper-cells.csv").read_text().splitlines()
    assert len(rows) == 1 + 4
    if HAVE_MPL:
        assert (tmp_path / "rep" / "paper-forest.png").stat().st_size > 0
        assert (tmp_path / "rep" / "paper-bandwidth-mbps-1-rho-4-return-vs-link.png").is_file()


def test_curves_median_and_iqr_across_seeds(tmp_path):
    """Per placement: the median and quartiles across seeds of each run's binned series."""
    root = sweep(
        tmp_path / "out",
        {
            ("1", "1"): {
                "learner": [dict(ref=r) for r in (1.0, 2.0, 3.0, 4.0)],
                "buffer": [dict(ref=0.5)],
            }
        },
    )
    runs, _ = load_experiment(root)
    x, cv = curves(runs, bins=10)  # updates 0..100 in bins of 10; evals at 10, 20, .., 100
    assert x == pytest.approx(np.arange(5, 100, 10))
    med, lo, hi = cv[("reference_loss", "learner")]
    assert med[1:] == pytest.approx(np.full(9, 2.5))  # median of 1, 2, 3, 4
    assert lo[1:] == pytest.approx(np.full(9, 1.75)) and hi[1:] == pytest.approx(np.full(9, 3.25))
    assert cv[("reference_loss", "buffer")][0][1:] == pytest.approx(np.full(9, 0.5))
    # training loss: 1 before update 50, 3 from it on, in every run
    med = cv[("loss", "learner")][0]
    assert med[0] == pytest.approx(1.0) and med[-1] == pytest.approx(3.0)


def test_one_grouping_for_link_profiles_and_sweep_cells(tmp_path):
    """A link profile is a cell whose axes are the link keys: the same grouping gives both,
    numbers in numeric order, learner first, seeds within a placement; the profile splits a
    placement whose runs differ in a setting into variants, the sweep's cell does not."""
    root = tmp_path / "out"
    for bw in ("10", "5"):
        for place in ("buffer", "learner"):
            for seed in (1, 0):
                write_run(
                    root / f"bandwidth_mbps={bw},replay_at={place}" / f"seed{seed}",
                    replay_at=place,
                    seed=seed,
                    config={"bandwidth_mbps": float(bw), "inflight": 1 + seed},
                )
    runs, errors = load_experiment(root)
    assert not errors
    profiles = group(runs, by="link")
    assert [p.label for p in profiles] == [
        "CartPole-v1, link None, bandwidth_mbps=5.0",
        "CartPole-v1, link None, bandwidth_mbps=10.0",
    ]
    assert [g.label for g in profiles[0].groups] == [
        "existing (replay_at=learner, inflight=1)",
        "existing (replay_at=learner, inflight=2)",
        "proposed (replay_at=buffer, inflight=1)",
        "proposed (replay_at=buffer, inflight=2)",
    ]
    cells = group(runs, root, by="sweep")
    assert [c.label for c in cells] == ["bandwidth_mbps=5", "bandwidth_mbps=10"]
    assert [(g.replay_at, [r.seed for r in g.runs]) for g in cells[0].groups] == [
        ("learner", [0, 1]),
        ("buffer", [0, 1]),
    ]


def test_a_long_cell_label_makes_a_short_unique_file_name():
    """A cell of many varying keys has a label of hundreds of characters; its plots' file names
    stay within the file system's limit (the paper report stopped on ENAMETOOLONG)."""
    a = ", ".join(f"key_{i}=value_{i}" for i in range(40))
    b = a.replace("value_39", "value_x")
    assert len(slugify(a)) <= SLUG_MAX and slugify(a) != slugify(b)
    assert slugify(a).startswith("key-0-value-0-key-1")
    assert slugify("bandwidth_mbps=1.25, rho=4") == "bandwidth-mbps-1.25-rho-4"
