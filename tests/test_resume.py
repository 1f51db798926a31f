"""Checkpoint and resume: unit round trips (no MPI), then one chain of real runs under mpirun.

The chain (three launches, module fixtures): (1) train until a greedy eval >= 100, SIGTERM ->
clean stop with a final checkpoint; (2) --resume it with periodic checkpoints and a fault that
SIGKILLs an actor between its temp files and their rename in a later checkpoint; (3) --resume
again: the previous complete checkpoint is used.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import pytest
from mpirun import mpirun_cmd, run_mpirl, stop_signal

from mpirl.replay import PrioritizedReplay
from mpirl.run import checkpoint as ck
from mpirl.run.checkpoint_arrays import StoredArray
from mpirl.run.config import ConfigError, parse, to_dict
from mpirl.transport.wire import transition_dtype

REC = transition_dtype((4,), np.float32)


def _memory(n: int, capacity: int = 1000, seed: int = 0) -> PrioritizedReplay:
    m = PrioritizedReplay(capacity, REC, alpha=0.6, eps=1e-3, seed=seed)
    rng = np.random.default_rng(seed)
    r = np.zeros(n, REC)
    r["obs"] = rng.normal(size=(n, 4))
    r["action"] = rng.integers(0, 2, n)
    r["reward"] = rng.normal(size=n)
    m.add(r, rng.random(n))
    if n:
        s = m.sample(32)
        m.update(s.indices, s.generations, rng.random(32) * 5)
    return m


# ---- unit level -------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [0, 300, 2500])  # empty, partly filled, wrapped ring
def test_memory_round_trip_same_items_priorities_generations(tmp_path, n):
    m = _memory(n)
    arrays, meta = ck.memory_state(m)
    ck.write_part(tmp_path, 1, "buffer-0", {"replay": meta}, arrays)
    ck.write_manifest(tmp_path, 1, ["buffer-0"], {"config": {}, "world_size": 3, "layout": []})
    manifest, skipped = ck.select(tmp_path)
    assert skipped == [] and manifest["id"] == 1
    part = ck.load_part(tmp_path, manifest, "buffer-0")
    m2 = PrioritizedReplay(1000, REC, alpha=0.6, eps=1e-3, seed=99)
    ck.restore_memory(m2, part.arrays, part.meta["replay"])
    assert len(m2) == len(m) and m2.inserted == m.inserted
    size = len(m)
    assert m2.state_dict()["storage"][:size].tobytes() == m.state_dict()["storage"][:size].tobytes()
    np.testing.assert_array_equal(m2.priorities(), m.priorities())
    assert m2.total_priority() == pytest.approx(m.total_priority())
    if size:  # the same generations and the same RNG: the next batch is the same batch
        a, b = m.sample(64), m2.sample(64)
        np.testing.assert_array_equal(a.indices, b.indices)
        np.testing.assert_array_equal(a.generations, b.generations)
        np.testing.assert_array_equal(a.weights, b.weights)


def test_memory_arrays_are_read_from_the_file_on_demand(tmp_path):
    """load_part hands the replay memory's arrays over as handles into the .npz (rows read when
    sliced), other arrays as numpy arrays; a file cut short after `select` checked it is one
    error naming it; a memory found corrupt part-way is left empty."""
    m = _memory(2500)
    arrays, meta = ck.memory_state(m)
    ck.write_part(tmp_path, 1, "buffer-0", {"replay": meta}, {**arrays, "x": np.arange(5)})
    ck.write_manifest(tmp_path, 1, ["buffer-0"], {"config": {}, "world_size": 3, "layout": []})
    part = ck.load_part(tmp_path, ck.select(tmp_path)[0], "buffer-0")
    stored, held = part.arrays["replay_storage"], m.state_dict()["storage"]
    assert isinstance(stored, StoredArray) and isinstance(part.arrays["x"], np.ndarray)
    assert stored.shape == (1000,) and stored.dtype == REC
    assert stored[10:20].tobytes() == held[10:20].tobytes()
    assert stored[995:2000].tobytes() == held[995:].tobytes()
    assert np.asarray(stored).tobytes() == held.tobytes()
    np.testing.assert_array_equal(
        np.asarray(part.arrays["replay_rng_state"]), arrays["replay_rng_state"]
    )
    path = ck.root(tmp_path) / "000001" / "buffer-0.npz"
    path.write_bytes(path.read_bytes()[: stored.offset + 500 * REC.itemsize])
    target = _memory(300)
    with pytest.raises(ck.CheckpointError, match="buffer-0.npz.*truncated"):
        ck.restore_memory(target, part.arrays, part.meta["replay"])
    assert len(target) == 300  # the RNG state is read first: the memory is as it was
    state = {k: np.array(v) for k, v in target.state_dict().items()}
    state["priorities"][100] = 0  # found corrupt after the copy began: empty, not half restored
    with pytest.raises(ValueError, match="corrupt"):
        target.load_state_dict(state)
    assert len(target) == 0 and target.total_priority() == 0


def test_learner_tensors_round_trip_without_pickle(tmp_path):
    """Networks, the learner's Adam state (mpirl.agent.dqn.Adam, fused kernel) and the torch RNG
    load with torch.load(weights_only=True)."""
    import torch

    from mpirl.agent.dqn import Adam
    from mpirl.agent.qnet import make_torch_q

    torch.manual_seed(0)
    q, tq = make_torch_q(4, 2, (32, 32), False), make_torch_q(4, 2, (32, 32), False)
    opt = Adam(q.parameters(), lr=1e-3)
    for _ in range(3):
        opt.zero_grad()
        q(torch.randn(8, 4)).sum().backward()
        opt.step()
    state = {
        "online": q.state_dict(),
        "target": tq.state_dict(),
        "optimizer": opt.state_dict(),
        "torch_rng": torch.get_rng_state(),
    }
    ck.write_part(tmp_path, 4, "learner", {"updates": 3}, None, state)
    ck.write_manifest(tmp_path, 4, ["learner"], {"config": {}, "world_size": 3, "layout": []})
    part = ck.load_part(tmp_path, ck.select(tmp_path)[0], "learner")
    q2 = make_torch_q(4, 2, (32, 32), False)
    opt2 = Adam(q2.parameters(), lr=1e-3)
    q2.load_state_dict(part.torch["online"])
    opt2.load_state_dict(part.torch["optimizer"])
    torch.set_rng_state(part.torch["torch_rng"])
    x = torch.randn(8, 4)
    torch.set_rng_state(state["torch_rng"])
    assert torch.equal(x, torch.randn(8, 4))  # the same random stream continues
    assert torch.equal(q(x), q2(x))
    for o in (opt, opt2):  # one more identical step: same Adam moments and step counts
        o.zero_grad()
    q(x).sum().backward()
    q2(x).sum().backward()
    opt.step()
    opt2.step()
    assert all(torch.equal(a, b) for a, b in zip(q.parameters(), q2.parameters(), strict=True))
    assert part.meta["updates"] == 3


def _two_generations(tmp_path):
    for i in (1, 2):
        ck.write_part(tmp_path, i, "actor-2", {"env_steps": i}, {"x": np.arange(10 * i)})
        ck.write_manifest(tmp_path, i, ["actor-2"], {"config": {}, "world_size": 3, "layout": []})


def test_corrupt_newest_falls_back_to_previous(tmp_path):
    _two_generations(tmp_path)
    f = ck.root(tmp_path) / "000002" / "actor-2.npz"
    data = bytearray(f.read_bytes())
    data[-5] ^= 0xFF
    f.write_bytes(bytes(data))
    manifest, skipped = ck.select(tmp_path)
    assert manifest["id"] == 1 and "SHA-256" in skipped[0] and "checkpoint 2" in skipped[0]
    assert ck.load_part(tmp_path, manifest, "actor-2").meta["env_steps"] == 1
    (ck.root(tmp_path) / "000001" / "actor-2.npz").write_bytes(b"short")  # both bad now
    with pytest.raises(
        ck.CheckpointError, match="no usable checkpoint.*checkpoint 2.*checkpoint 1.*bytes"
    ):
        ck.select(tmp_path)


def test_kill_between_temp_write_and_rename_keeps_previous(tmp_path):
    _two_generations(tmp_path)

    def killed():
        raise KeyboardInterrupt("killed")  # stands in for SIGKILL: nothing after it runs

    with pytest.raises(KeyboardInterrupt):
        ck.write_part(tmp_path, 3, "actor-2", {"env_steps": 3}, {"x": np.arange(3)}, None, killed)
    assert (ck.root(tmp_path) / "000003" / "actor-2.npz.tmp").exists()
    manifest, skipped = ck.select(tmp_path)
    assert manifest["id"] == 2 and skipped == []
    assert ck.next_id(tmp_path) == 4  # never reuses the interrupted attempt's folder
    ck.write_part(tmp_path, 4, "actor-2", {"env_steps": 4}, {"x": np.arange(4)})
    ck.write_manifest(tmp_path, 4, ["actor-2"], {"config": {}, "world_size": 3, "layout": []})
    names = sorted(p.name for p in ck.root(tmp_path).iterdir())
    assert names == ["000002", "000004", "manifest-000002.json", "manifest-000004.json"]


def test_no_checkpoint_and_missing_folder(tmp_path):
    with pytest.raises(ck.CheckpointError, match="no such run folder"):
        ck.select(tmp_path / "nope")
    with pytest.raises(ck.CheckpointError, match="no complete checkpoint"):
        ck.select(tmp_path)


def test_resume_config_only_budgets_may_change(tmp_path):
    stored = to_dict(parse(["--hidden", "32", "32", "--lr", "0.003", "--target-return", "none"]))
    stored = json.loads(json.dumps(stored))  # as it comes back from the manifest
    cfg = parse(
        ["--resume", str(tmp_path), "--max-seconds", "7", "--target-return", "200"], stored=stored
    )
    assert cfg.hidden == (32, 32) and cfg.lr == 0.003 and cfg.max_seconds == 7.0
    assert cfg.target_return == 200.0 and cfg.run_dir == str(tmp_path)
    with pytest.raises(ConfigError, match="may be given with it, not --lr, --hidden"):
        parse(["--resume", str(tmp_path), "--lr", "1", "--hidden", "8"], stored=stored)


# ---- under mpirun: one chain of launches ------------------------------------------------------

RUN = [
    "--hidden",
    "32",
    "32",
    "--target-return",
    "none",
    "--eval-every",
    "500",
    "--seed",
    "1",
    "--progress-seconds",
    "0",
    "--flush-seconds",
    "1",
    "--checkpoint-seconds",
    "0",
]


def _evals(run: Path) -> np.ndarray:
    try:
        with h5py.File(run / "learner.h5", "r", locking=False) as f:
            return f["evals/ret_mean"][()] if "evals" in f else np.zeros(0)
    except (OSError, KeyError, RuntimeError):  # not created yet, or read overlapped a flush
        # (h5py raises RuntimeError "addr overflow" for a read that met a half-written block)
        return np.zeros(0)


def _read(path: Path) -> tuple[dict, dict]:
    with h5py.File(path, "r") as f:
        data = {}
        f.visititems(
            lambda n, o: data.__setitem__(n, o[()]) if isinstance(o, h5py.Dataset) else None
        )
        return data, dict(f.attrs)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Launch 1: train until a greedy eval >= 100 (at most 100 s), then SIGTERM (Open MPI:
    SIGUSR1, see tests/mpirun.py)."""
    run = tmp_path_factory.mktemp("resume") / "run"
    proc = subprocess.Popen(
        [
            *mpirun_cmd(4),
            sys.executable,
            "-m",
            "mpirl.main",
            "--run-dir",
            str(run),
            "--max-seconds",
            "100",
            *RUN,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 150
    while time.monotonic() < deadline and proc.poll() is None:
        if _evals(run).max(initial=0) >= 100:
            break
        time.sleep(0.5)
    proc.send_signal(stop_signal())
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, out + err
    return run, out


def test_sigterm_writes_a_final_checkpoint(trained):
    run, out = trained
    summary = json.loads((run / "summary.json").read_text())
    assert summary["stop_reason"] == stop_signal().name, out
    assert _evals(run).max() >= 100, "launch 1 did not learn to 100: nothing to carry on"
    manifest, _ = ck.select(run)
    assert manifest["id"] == summary["checkpoint"] and manifest["reason"] == stop_signal().name
    assert sorted(manifest["parts"]) == ["actor-2", "actor-3", "buffer-0", "learner"]
    assert manifest["counters"]["updates"] == summary["updates"]
    assert manifest["counters"]["env_steps"] == summary["env_steps"]
    steps = sum(p["meta"]["env_steps"] for n, p in manifest["parts"].items() if "actor" in n)
    assert steps == summary["env_steps"]  # a consistent cut: every step counted once


@pytest.fixture(scope="module")
def resumed(trained):
    """Launch 2: --resume with periodic checkpoints; actor 2 is SIGKILLed in the middle of
    writing a checkpoint (between temp write and rename) 6 s into its loop."""
    run, _ = trained
    before = {p.name: _read(p) for p in run.glob("*.h5")}
    manifest = ck.select(run)[0]
    ckpt_before = manifest["id"]
    saved = ck.load_part(run, manifest, "learner")  # read now: later checkpoints rotate it out
    p = run_mpirl(
        4,
        "--resume",
        str(run),
        "--max-seconds",
        "60",
        "--checkpoint-seconds",
        "2",
        env={"MPIRL_FAULT": "actor:2:6:checkpoint", "MPIRL_TRACEBACK": "0"},
        timeout=120,
    )
    return run, before, ckpt_before, p, saved


def _rows_past_checkpoint(run: Path, name: str) -> dict:
    """Per stream of ``name``.h5, the rows between its newest resume's checkpoint and the
    resume: written by the launch before, after its part of the checkpoint."""
    _, attrs = _read(run / f"{name}.h5")
    r = json.loads(attrs["resumes_json"])[-1]
    at, before = r["rows_at_checkpoint"], r["rows_before_resume"]
    assert at.keys() == before.keys()
    return {k: before[k] - at[k] for k in at if before[k] != at[k]}


def test_a_resumed_run_keeps_its_first_launchs_loop_start(resumed):
    """Time zero of every time-window metric is the loop start of the run's first launch: a
    resume must not move it, or the earlier launches' rows get negative times and drop out of
    every window (analysis.runs)."""
    run, before, *_ = resumed
    first = before["learner.h5"][1]["loop_start_t"]
    data, attrs = _read(run / "learner.h5")
    assert attrs["loop_start_t"] == first
    assert (data["progress/t"] - first > 0).all()


def test_policy_lag_after_a_resume_is_not_the_restored_update_count(resumed):
    """After a resume the actors act with the weights the learner broadcasts at its start: no
    /lag row of the resumed launch may report the whole restored update count as lag (the
    buffer's cache, which the lag used to be read from, says 0 updates until a keyframe)."""
    run, _, _, _, saved = resumed
    restored = saved.meta["updates"]
    data, attrs = _read(run / "learner.h5")
    t_resume = float(np.atleast_1d(attrs["resumed_unix"])[-1] - attrs["t0_unix"])
    after = data["lag/t"] >= t_resume
    assert after.sum() > 0
    assert data["lag/lag_updates"][after].max() < restored, restored


def test_row_counts_after_a_clean_stop(resumed):
    """After a clean stop every row is counted in the final checkpoint: the learner's held
    /updates and /transfers rows and the evaluation drained at the stop too.  The rows past
    it are a buffer's and an actor's closing rows, which carry no work past the checkpoint."""
    run, before, ckpt_before, _, saved = resumed
    assert _rows_past_checkpoint(run, "learner") == {}
    assert set(_rows_past_checkpoint(run, "buffer-0")) <= {"link", "site"}
    for a in ("actor-2", "actor-3"):
        assert _rows_past_checkpoint(run, a) == {"actor": 1}
    _, attrs = _read(run / "learner.h5")
    r = json.loads(attrs["resumes_json"])[-1]
    assert r["checkpoint"] == ckpt_before and r["reason"] == stop_signal().name
    # the closing rows hold the counters of the checkpoint (no work happened after it)
    old_buf, old_battrs = before["buffer-0.h5"]
    assert old_buf["site/env_steps"][-1] == old_battrs["env_steps"] == saved.meta["site_steps"]["0"]
    for a in ("actor-2.h5", "actor-3.h5"):
        old, old_attrs = before[a]
        assert old["actor/env_steps"][-1] == old_attrs["env_steps"]


def test_resume_continues_counters_logs_and_learning(resumed):
    run, before, ckpt_before, p, saved = resumed
    assert p.returncode != 0 and "injected fault: SIGKILL while writing a checkpoint" in p.stderr
    assert f"resuming {run} from checkpoint {ckpt_before}" in p.stdout
    learner, attrs = _read(run / "learner.h5")
    old, _ = before["learner.h5"]
    resumes = json.loads(attrs["resumes_json"])
    assert resumes[-1]["checkpoint"] == ckpt_before
    k = resumes[-1]["rows_before_resume"]["updates"]
    n_old = len(old["updates/update"])
    assert k == n_old and len(learner["updates/update"]) > n_old  # appended, not overwritten
    np.testing.assert_array_equal(learner["updates/update"][:n_old], old["updates/update"])
    # the update counter continues from the checkpoint (a clean stop: no rows past it)
    assert learner["updates/update"][n_old] == old["updates/update"][-1] + 1
    assert np.all(np.diff(learner["updates/update"]) == 1)
    # the networks carried over: the files hold the networks the learner had at the save, and
    # the resumed learner, before its first update, has exactly those (an eval after up to
    # eval_every fresh updates could pass by relearning CartPole)
    for net in ("online", "target"):
        assert ck.params_sha256(saved.torch[net]) == saved.meta[f"{net}_sha256"]
        assert attrs[f"resumed_{net}_sha256"] == saved.meta[f"{net}_sha256"], net
    # learning carries on: the first greedy eval after the resume is not back to random
    e = resumes[-1]["rows_before_resume"]["evals"]
    assert len(learner["evals/ret_mean"]) > e, p.stdout + p.stderr
    # random greedy nets score 9-20 here; a learning net's eval dipped to 47.9 once (CI 17:40)
    assert learner["evals/ret_mean"][e] >= 30, learner["evals/ret_mean"]
    assert learner["evals/env_steps"][e] > old["evals/env_steps"][-1]
    # the buffer continued with its replay memory: nothing lost, counters continue
    buf, battrs = _read(run / "buffer-0.h5")
    _, boattrs = before["buffer-0.h5"]
    r = json.loads(battrs["resumes_json"])[-1]["rows_before_resume"]["site"]
    assert buf["site/inserted"][r] >= boattrs["inserted"]
    assert buf["site/replay_size"][r] >= min(boattrs["inserted"], 100_000) > 0
    assert buf["site/env_steps"][r] >= boattrs["env_steps"]
    for a in ("actor-2.h5", "actor-3.h5"):
        data, _ = _read(run / a)
        assert len(data["episodes/ret"]) > len(before[a][0]["episodes/ret"])


@pytest.mark.mpi
def test_kill_during_checkpoint_leaves_previous_usable(resumed):
    run, _, ckpt_before, _, _ = resumed
    man, folders = ck.ids(run)
    assert max(folders) > max(man)  # the interrupted attempt's folder, without a manifest
    manifest, skipped = ck.select(run)
    assert skipped == [] and manifest["id"] > ckpt_before and manifest["reason"] == "periodic"
    # a consistent periodic cut: the steps each actor had reported are exactly those its buffer
    # counted; steps not yet reported travel in the actor's part and are reported after resume
    parts = [p_["meta"] for n, p_ in manifest["parts"].items() if "actor" in n]
    assert sum(x["steps_reported"] for x in parts) == manifest["counters"]["env_steps"]
    assert manifest["parts"]["buffer-0"]["meta"]["env_steps"] == manifest["counters"]["env_steps"]
    assert all(x["env_steps"] >= x["steps_reported"] for x in parts)
    p3 = run_mpirl(4, "--resume", str(run), "--max-seconds", "1", timeout=120)
    assert p3.returncode == 0, p3.stdout + p3.stderr
    assert f"from checkpoint {manifest['id']} (periodic)" in p3.stdout
    summary = json.loads((run / "summary.json").read_text())
    assert summary["resumed_from"] == manifest["id"]
    # rows [rows_at_checkpoint, rows_before_resume) are the killed launch's after the
    # checkpoint: without them the update numbers run on with no gap and no repeat
    learner, attrs = _read(run / "learner.h5")
    r = json.loads(attrs["resumes_json"])[-1]
    at, cut = r["rows_at_checkpoint"]["updates"], r["rows_before_resume"]["updates"]
    upd = learner["updates/update"]
    assert upd[at - 1] == manifest["counters"]["updates"]
    assert np.all(np.diff(np.concatenate([upd[:at], upd[cut:]])) == 1)
    assert r["checkpoint"] == manifest["id"] and r["reason"] == "periodic"
    assert summary["updates"] >= manifest["counters"]["updates"]
    man, folders = ck.ids(run)
    assert man == folders and len(man) == ck.KEEP  # the partial folder is gone


@pytest.mark.mpi
def test_wrong_world_size_is_one_clear_error(trained):
    run, _ = trained
    p = run_mpirl(3, "--resume", str(run), timeout=60)
    assert p.returncode != 0
    lines = [x for x in p.stderr.splitlines() if x.startswith("mpirl: error:")]
    assert len(lines) == 1, p.stderr
    assert "checkpointed by 4 ranks" in lines[0] and "this job has 3" in lines[0]
    assert "mpirun -n 4" in lines[0]


@pytest.mark.mpi
def test_corrupt_checkpoint_is_one_clear_error(trained, tmp_path):
    run, _ = trained
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    for f in (copy / "checkpoint").glob("*/buffer-0.npz"):
        f.write_bytes(f.read_bytes()[:-100])  # truncated in every generation
    p = run_mpirl(4, "--resume", str(copy), timeout=60)
    assert p.returncode != 0
    lines = [x for x in p.stderr.splitlines() if x.startswith("mpirl: error:")]
    assert len(lines) == 1, p.stderr
    assert "no usable checkpoint" in lines[0] and "buffer-0.npz" in lines[0]
    assert "Traceback" not in p.stderr


# ---- job scripts: a requeued job continues from a checkpoint ---------------------------------


@pytest.mark.parametrize(
    "job, first, tries",
    [
        ("single-node.sbatch", "j-7-r2", ["j-7-r1", "j-7-r0"]),  # same code in edge-cloud*.sbatch
    ],
)
def test_requeued_job_resumes_the_try_with_a_checkpoint(tmp_path, job, first, tries):
    import os

    root = Path(__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env.update(
        MPIRL_DRY_RUN="1",
        RUN_ROOT=str(tmp_path),
        EXPERIMENT_DIR=str(tmp_path),
        SLURM_JOB_ID="7",
        SLURM_JOB_NAME="j",
        SLURM_RESTART_COUNT="2",
        SLURM_ARRAY_TASK_ID="0",
    )

    def launch() -> str:
        r = subprocess.run(
            ["bash", str(root / "jobs" / job)],
            capture_output=True,
            text=True,
            check=False,
            env=env,
            cwd=root,
            timeout=60,
        )
        assert r.returncode == 0, r.stderr
        return next(x for x in r.stdout.splitlines() if x.startswith("+ "))

    assert f"--run-dir {tmp_path}/{first}" in launch()  # no checkpoint anywhere: a new run
    for older in reversed(tries):  # the newest earlier try with a checkpoint wins
        (tmp_path / older / "checkpoint").mkdir(parents=True)
        (tmp_path / older / "checkpoint" / "manifest-000004.json").write_text("{}")
        line = launch()
        assert f" --resume {tmp_path}/{older} --max-seconds " in line, line
        assert "--run-dir" not in line and "--seed" not in line
