"""analysis.export: the equal-wall-time design's per-run rows and curves, computed by hand on a
small synthetic run (tests/test_paper_metrics.write_run), and merged across sittings."""

from __future__ import annotations

import csv
import math

import numpy as np
import pytest
from test_paper_metrics import write_run

from analysis import export as X
from analysis.runs import load_run


def _run(path, **kw):
    u = np.arange(1, 101)
    xf = {
        "t": np.array([2.0, 6.0, 8.0]),
        "update": np.array([20, 60, 80]),
        "n": np.array([100, 10, 30]),
        "kind": np.array([5, 5, 5]),
        "nbytes": np.array([1000, 1000, 1000]),
        "priority_mean": np.array([9.0, 1.0, 2.0]),
        "priority_td_mean": np.array([90.0, 1.0, 3.0]),
        "priority_median": np.ones(3),
        "priority_p90": np.ones(3),
        "arrival_td_mean": np.array([9.0, 2.0, 4.0]),
        "arrival_priority_mean": np.ones(3),
        "arrival_n": np.array([64, 10, 30]),
    }
    path = write_run(path, transfers=xf, hit_t=6.0, **kw)
    import h5py

    with h5py.File(path / "learner.h5", "r+") as f:
        f["updates/loss_unweighted"] = np.where(u >= 50, 7.0, 1.0)
        f["evals/reference_q_sq_mean"] = np.where(np.arange(1.0, 11.0) >= 5, 4.0, 1.0)
        f["evals"].attrs["fields"] = [*f["evals"].attrs["fields"], "reference_q_sq_mean"]
        f["updates"].attrs["fields"] = [*f["updates"].attrs["fields"], "loss_unweighted"]
    return path


def test_run_row_by_hand(tmp_path):
    run = load_run(
        _run(tmp_path / "x" / "bw=1" / "replay_at=buffer" / "seed3", replay_at="buffer", seed=3)
    )
    r = X.run_row(run, tmp_path / "x")
    assert r["cell"] == "bw=1" and r["seed"] == 3 and r["T"] == 10.0
    # requested rates from the config: unpaced here (no layout, no pacing flags)
    assert math.isnan(r["P_requested"]) and math.isnan(r["U_requested"])
    # W = [5, 10]: updates 50..100 (loss 3, unweighted 7); transfers at t 6 and 8
    assert r["train_loss"] == 3.0 and r["train_loss_unweighted"] == 7.0
    assert r["prio_td_held"] == pytest.approx((10 * 1.0 + 30 * 3.0) / 40)
    assert r["prio_held"] == pytest.approx((10 * 1.0 + 30 * 2.0) / 40)
    assert r["arrival_td"] == pytest.approx((10 * 2.0 + 30 * 4.0) / 40)
    # evaluations at t = 1..10 return 100 before t = 6, 500 from it: held step function
    assert r["auc_return"] == pytest.approx((6 * 100 + 4 * 500) / 10)
    assert r["final_return"] == 500.0 and r["evals"] == 10
    assert r["reached"] and r["time_to_target_s"] == 6.0 and r["target"] == 475.0
    assert r["link_mb"] == pytest.approx(1.0)  # 1e5 B/s for 10 s
    assert r["return_per_mb"] == pytest.approx(r["auc_return"])
    assert math.isnan(r["delivered_fraction"])  # the proposed placement delivers by sampling
    # reference loss 1 at every evaluation, Q scale 4 in W: normalised 0.25; NaN without it
    assert r["ref_loss"] == 1.0 and r["ref_loss_norm"] == pytest.approx(0.25)


def test_not_reached_is_censored_at_T(tmp_path):
    run = load_run(
        write_run(tmp_path / "r", replay_at="learner", seed=0, hit_t=None, max_seconds=8.0)
    )
    r = X.run_row(run, tmp_path)
    assert r["T"] == 8.0 and not r["reached"] and r["time_to_target_s"] == 8.0
    assert r["auc_return"] == 100.0 and r["evals"] == 8


def test_held_return_and_auc():
    te, ret = np.array([2.0, 5.0]), np.array([10.0, 30.0])
    np.testing.assert_array_equal(
        X.held_return(te, ret, np.array([0, 2, 4.9, 5, 9])), [10, 10, 10, 30, 30]
    )
    assert X.auc(te, ret, 10.0) == pytest.approx((5 * 10 + 5 * 30) / 10)
    assert X.auc(te, ret, 4.0) == 10.0


def test_export_merges_across_sittings(tmp_path):
    root, into = tmp_path / "exp", tmp_path / "data"
    _run(root / "replay_at=learner" / "seed0", replay_at="learner", seed=0)
    assert X.export(root, into) == 1
    _run(root / "replay_at=buffer" / "seed0", replay_at="buffer", seed=0)
    assert X.export(root / "replay_at=buffer", into) == 1  # a second sitting, another run
    with (into / "runs.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert sorted(r["replay_at"] for r in rows) == ["buffer", "learner"]
    assert X.export(root, into) == 2  # both again: replaced, not duplicated
    with (into / "curves.csv").open() as f:
        curves = list(csv.DictReader(f))
    assert len(curves) == 2 * (X.GRID + 1)
    first = [c for c in curves if c["run"].endswith("replay_at=learner/seed0")]
    assert float(first[-1]["t"]) == 10.0 and float(first[-1]["return"]) == 500.0


def _with_progress(path, rows):
    import h5py

    with h5py.File(path / "learner.h5", "r+") as f:
        g = f.create_group("progress")
        for k, v in rows.items():
            g[k] = np.asarray(v)
        g.attrs["fields"] = list(rows)
    return path


def test_delivered_fraction_is_the_ratio_of_the_window_totals(tmp_path):
    """The env steps arrive in the buffers' step reports while transitions count as they land:
    a row whose report came late holds many transitions over few steps.  Here 10 transitions
    land in every row, and every third row brings a report of 181 steps, the others 1: the
    rows' median ratio reads 10 (the export gave 15.3 for a thinned run on a loaded machine in
    CI, 2026-12-05); the totals say 100 / 730 (failed before: the export took the median)."""
    t = np.arange(1.0, 11.0)
    d_steps = np.where(np.arange(10) % 3 == 0, 181.0, 1.0)  # a late report every third row
    d_in = np.full(10, 10.0)
    steps, delivered = np.cumsum(d_steps), np.cumsum(d_in)
    prog = {
        "t": t,
        "env_steps": steps.astype(int),
        "env_steps_per_s": d_steps,
        "interval_s": np.ones(10),
        "delivered_fraction": d_in / d_steps,
        "delivered": delivered.astype(int),
        "rho": 64 / d_steps,
        "sampled": np.cumsum(np.full(10, 64)),
    }
    path = _with_progress(write_run(tmp_path / "r", replay_at="learner", seed=0), prog)
    r = X.run_row(load_run(path), tmp_path)
    # window rows t >= 1 (all ten): from the totals before the first row (0, 0) to the last
    assert r["delivered_fraction"] == pytest.approx(100 / d_steps.sum())
    assert r["rho"] == pytest.approx(640 / d_steps.sum())  # 64 trained per row, likewise
    assert r["delivered_fraction"] < 0.5 < np.median(prog["delivered_fraction"])
    # a run logged before the totals: the rows' median, as before
    del prog["delivered"]
    path = _with_progress(write_run(tmp_path / "old", replay_at="learner", seed=0), prog)
    assert X.run_row(load_run(path), tmp_path)["delivered_fraction"] == 10.0
    # a run resumed under the version that logs the totals: its earlier rows hold -1 there,
    # and a window that starts in them keeps the rows' median
    prog["delivered"] = np.where(t < 5, -1, delivered.astype(int))
    path = _with_progress(write_run(tmp_path / "mixed", replay_at="learner", seed=0), prog)
    assert X.run_row(load_run(path), tmp_path)["delivered_fraction"] == 10.0
    # the buffer placement has none (its rows say -1)
    prog["delivered"] = np.full(10, -1)
    path = _with_progress(write_run(tmp_path / "b", replay_at="buffer", seed=0), prog)
    assert math.isnan(X.run_row(load_run(path), tmp_path)["delivered_fraction"])


def _with_site(path, rows, site=0):
    import h5py

    with h5py.File(path / f"buffer-{site}.h5", "w") as f:
        f.attrs["role"], f.attrs["site"], f.attrs["t0_unix"] = "buffer", site, 1000.0
        g = f.create_group("site")
        for k, v in rows.items():
            g[k] = np.asarray(v)
        g.attrs["fields"] = list(rows)
    return path


def test_delivered_fraction_and_rho_count_env_steps_at_the_buffers(tmp_path):
    """The learner's env steps lag production by a step report (0.25 s) and the link, so over a
    short window its totals can hold more transitions than reported steps: a 2 s thinned run
    in CI read a delivered fraction of 1.11 where its buffer forwarded 0.49 of its steps.  The
    buffers count both where they happen (/site env_steps and forwarded); here they produce 100
    steps a second and forward half from t = 1 s, while the learner's reports lag by 2 s (failed
    before: the learner's totals read 450 / 800 = 0.5625 and rho 0.45)."""
    t = np.arange(1.0, 11.0)
    reported = 100.0 * np.clip(t - 2, 0, None)
    delivered = 50.0 * (t - 1)
    prog = {
        "t": t,
        "env_steps": reported.astype(int),
        "env_steps_per_s": np.diff(reported, prepend=0.0),
        "interval_s": np.ones(10),
        "delivered_fraction": np.full(10, np.nan),
        "delivered": delivered.astype(int),
        "rho": np.full(10, np.nan),
        "sampled": (40.0 * t).astype(int),
    }
    ts = np.arange(0.0, 11.0)  # the buffer's rows, on its own clock
    site = {"t": ts, "env_steps": 100.0 * ts, "forwarded": 50.0 * (ts - 1).clip(0)}
    path = write_run(tmp_path / "r", replay_at="thinned", seed=0, max_seconds=10.0)
    path = _with_site(_with_progress(path, prog), site)
    r = X.run_row(load_run(path), tmp_path)
    assert r["delivered_fraction"] == pytest.approx(0.5)  # the buffers' rows, [1, 10] s
    assert r["rho"] == pytest.approx(0.4)  # 400 trained over 1000 steps produced in [0, 10] s
    # without the buffers' files the learner's own totals stand (and show the lag)
    path = _with_progress(write_run(tmp_path / "nob", replay_at="thinned", seed=0), prog)
    assert X.run_row(load_run(path), tmp_path)["rho"] == pytest.approx(400 / 800)


def test_requested_rates_come_from_the_config_and_layout(tmp_path):
    import json

    import h5py

    path = write_run(
        tmp_path / "r",
        replay_at="learner",
        seed=0,
        config={"actor_steps_per_s": 3000, "learner_updates_per_s": 46.875},
    )
    layout = [{"rank": 0, "role": "learner"}, {"rank": 1, "role": "buffer"}] + [
        {"rank": r, "role": "actor"} for r in range(2, 6)
    ]
    with h5py.File(path / "learner.h5", "r+") as f:
        f.attrs["layout_json"] = json.dumps(layout)
    r = X.run_row(load_run(path), tmp_path)
    assert r["P_requested"] == 12000.0 and r["U_requested"] == 46.875


def test_trained_batch_td_by_quarter_and_the_within_placement_null(tmp_path):
    """Issue 47: /updates/td_abs_mean (|td| of every trained batch) over [0, T] and by quarter,
    in every placement; the null is the arrival |td| of what was forwarded into the learner's
    memory (kind FORWARD rows), weighted by arrival_n; BATCH rows are sampled, not a null."""
    run = load_run(
        _run(tmp_path / "x" / "bw=1" / "replay_at=learner" / "seed0", replay_at="learner", seed=0)
    )
    import h5py

    with h5py.File(run.path / "learner.h5", "r+") as f:
        f["transfers/kind"][...] = [4, 4, 5]  # t = 2, 6: forwarded; t = 8: a sampled batch
    r = X.run_row(load_run(run.path), tmp_path / "x")
    # updates 1..100 at t = u / 10, T = 10: |td| 5 before update 50, 0.5 from it
    assert r["batch_td"] == pytest.approx((49 * 5.0 + 51 * 0.5) / 100)
    assert r["batch_td_q1"] == 5.0  # (0, 2.5]: updates 1..25
    assert r["batch_td_q2"] == pytest.approx((24 * 5.0 + 0.5) / 25)  # updates 26..50
    assert r["batch_td_q3"] == r["batch_td_q4"] == 0.5
    assert r["null_td"] == pytest.approx((64 * 9.0 + 10 * 2.0) / 74)
    assert r["null_td_q1"] == 9.0 and r["null_td_q3"] == 2.0
    assert math.isnan(r["null_td_q2"]) and math.isnan(r["null_td_q4"])  # t = 8 is not a null
    # the replay memory at the buffer: trained |td| exported, no null (nothing forwarded)
    b = X.run_row(load_run(_run(tmp_path / "b", replay_at="buffer", seed=0)), tmp_path)
    assert b["batch_td_q1"] == 5.0 and math.isnan(b["null_td"]) and math.isnan(b["null_td_q1"])
    assert set(X.RUN_FIELDS) >= {"batch_td", "batch_td_q4", "null_td", "null_td_q4"}


def test_a_folder_the_sweep_set_aside_is_not_a_run(tmp_path):
    """The sweep moves a partial run to ``<run>.incomplete-<n>`` and runs it again beside it;
    exporting the whole root took both (the pilot's seed 101 gave a 58-AUC row of a killed
    run beside its rerun's, 2026-12-05; failed before)."""
    from analysis.runs import find_runs

    cell = tmp_path / "root" / "cell=a,replay_at=learner"
    write_run(cell / "seed1", replay_at="learner", seed=1)
    write_run(cell / "seed1.incomplete-1", replay_at="learner", seed=1)
    assert find_runs(tmp_path / "root") == [cell / "seed1"]
    assert find_runs(cell / "seed1.incomplete-1") == [cell / "seed1.incomplete-1"]  # named
    X.main([str(tmp_path / "root"), "--into", str(tmp_path / "out")])
    with open(tmp_path / "out" / "runs.csv", newline="") as f:
        assert [r["run"] for r in csv.DictReader(f)] == [str(cell / "seed1")]
