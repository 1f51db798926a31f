"""Using what was trained: one short real run under mpirun on the user's own env
(tests/toy_env.py: module:id, --env-kwargs, --env-wrappers, --tensorboard), then best.pt, play,
export, the dashboard files, --resume and the seeds on that run; play and export of MinAtar and
Atari networks on run folders made here; the optional extras' clear errors.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import h5py
import numpy as np
import pytest
from mpirun import run_mpirl

from mpirl import play as P
from mpirl.agent import envs
from mpirl.roles import best_model
from mpirl.run.config import parse, to_dict

TESTS = Path(__file__).parent
HAVE_TB = importlib.util.find_spec("tensorboard") is not None
HAVE_ONNX = all(importlib.util.find_spec(m) for m in ("onnx", "onnxscript"))
HAVE_VIDEO = all(importlib.util.find_spec(m) for m in ("moviepy", "pygame"))
HAVE_IMAGES = all(importlib.util.find_spec(m) for m in ("ale_py", "minatar", "cv2"))
OPTIMUM = 28.0  # toy env n=3, length=7, rewards (r + 1) * 2: 4 per step when right
TOY = [
    "--env",
    "toy_env:MpirlSignal-v0",
    "--env-kwargs",
    '{"n": 3, "length": 7}',
    "--env-wrappers",
    "toy_env:plus_one,toy_env:double",
]
TRAIN = [
    "--seed",
    "5",
    "--target-return",
    str(OPTIMUM),
    "--max-seconds",
    "40",
    "--eval-every",
    "100",
    "--eval-episodes",
    "3",
    "--learning-starts",
    "200",
    "--hidden",
    "32",
    "--gamma",
    "0.1",
    "--n-step",
    "1",
    "--flush-seconds",
    "1",
    "--progress-seconds",
    "1",
]


def _env() -> dict:
    return {
        "PYTHONPATH": os.pathsep.join(x for x in (str(TESTS), os.environ.get("PYTHONPATH")) if x)
    }


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """A toy-env run that reached the optimum (stops at --target-return), with --tensorboard."""
    run = tmp_path_factory.mktemp("toy") / "run"
    p = run_mpirl(
        3,
        *TOY,
        *TRAIN,
        *(["--tensorboard"] if HAVE_TB else []),
        "--run-dir",
        str(run),
        timeout=120,
        env=_env(),
    )
    assert p.returncode == 0, p.stdout + p.stderr
    assert "stopping (target_return)" in p.stdout, p.stdout
    return run


def _play(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "mpirl.play", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **_env()},
        check=False,
    )


def _returns(stdout: str) -> list[float]:
    return [
        float(x.split("return")[1].split()[0])
        for x in stdout.splitlines()
        if x.startswith("episode")
    ]


# ---- the user's own env under mpirun ----------------------------------------------------------


def test_own_env_kwargs_and_wrappers_at_actors_and_evaluator(trained):
    with h5py.File(trained / "learner.h5", "r") as f:
        cfg = json.loads(f.attrs["config_json"])
        evals = f["evals/ret_mean"][()]
    assert cfg["env"] == "toy_env:MpirlSignal-v0"
    assert cfg["env_kwargs"] == {"n": 3, "length": 7}
    assert cfg["env_wrappers"] == "toy_env:plus_one,toy_env:double"
    with h5py.File(trained / "actor-2.h5", "r") as f:
        length, ret = f["episodes/length"][()], f["episodes/ret"][()]
    assert len(ret) > 10 and (length == 7).all()  # kwargs reached the actors' envs
    # (r + 1) * 2 per step: even returns in [14, 28]; the other order (2r + 1) gives odd ones
    assert (ret % 2 == 0).all() and ret.min() >= 14 and ret.max() <= OPTIMUM
    assert evals.max() == OPTIMUM and evals.min() >= 14  # the evaluator's envs too


def test_every_rank_logs_its_derived_seeds(trained):
    seeds = {}
    for name in ("learner", "buffer-0", "actor-2"):
        with h5py.File(trained / f"{name}.h5", "r") as f:
            seeds[name] = json.loads(f.attrs["seeds_json"])
    from mpirl import seeds as S

    assert seeds["learner"] == S.learner(5, 1, 3)
    assert seeds["buffer-0"] == S.buffer(5, 1)
    assert seeds["actor-2"] == S.actor(5, 2, 0, 1, 4)


# ---- best.pt -----------------------------------------------------------------------------------


def test_best_model_written_with_its_eval_and_played(trained):
    best = best_model.load(trained / "best.pt")
    with h5py.File(trained / "learner.h5", "r") as f:
        ev = {k: f[f"evals/{k}"][()] for k in ("update", "ret_mean", "env_steps")}
    i = int(np.argmax(ev["ret_mean"]))  # the first eval at the best mean
    assert best["eval"]["ret_mean"] == ev["ret_mean"][i] == OPTIMUM
    assert best["eval"]["update"] == ev["update"][i]
    assert best["eval"]["env_steps"] == ev["env_steps"][i]
    assert best["eval"]["episodes"] == 3 and best["eval"]["returns"].tolist() == [OPTIMUM] * 3
    assert not list(trained.glob("*.tmp"))
    p = _play(str(trained), "--checkpoint", "best", "--episodes", "3", "--seed", "11")
    assert p.returncode == 0, p.stderr
    assert "weights from best.pt: update" in p.stdout
    assert _returns(p.stdout) == [OPTIMUM] * 3  # env, kwargs and wrappers rebuilt from config
    assert f"mean return {OPTIMUM:.1f} +- 0.0 over 3 episodes (seed 11" in p.stdout


def test_best_model_kept_only_when_beaten(tmp_path):
    import torch

    sd = {"w": torch.ones(2)}
    assert best_model.offer(tmp_path, sd, np.array([1.0, 3.0]), -np.inf, update=5, env_steps=50)
    assert not best_model.offer(tmp_path, {"w": torch.zeros(2)}, np.array([2.0]), 2.0, update=6)
    # a resumed learner's best (from its checkpoint) can be below the best.pt on disk
    assert not best_model.offer(tmp_path, {"w": torch.zeros(2)}, np.array([1.5]), 1.0, update=7)
    assert best_model.offer(
        tmp_path, {"w": torch.full((2,), 9.0)}, np.array([4.0]), 2.0, update=8, env_steps=80
    )
    got = best_model.load(tmp_path / "best.pt")
    assert got["eval"]["update"] == 8 and got["eval"]["ret_mean"] == 4.0
    assert got["online"]["w"].tolist() == [9.0, 9.0]


# ---- play: checkpoints, console script, errors --------------------------------------------------


def test_play_checkpoint_latest_and_id_through_the_console_script(trained):
    mpirl = Path(sys.executable).parent / "mpirl"
    p = subprocess.run(
        [str(mpirl), "play", str(trained), "--checkpoint", "1", "--episodes", "2"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **_env()},
        check=False,
    )
    assert p.returncode == 0, p.stderr
    assert "weights from checkpoint 1" in p.stdout and len(_returns(p.stdout)) == 2
    assert P.main([str(trained), "--checkpoint", "latest", "--episodes", "0"]) == 0


@pytest.mark.parametrize(
    "args, text",
    [
        (["--checkpoint", "9"], "checkpoint 9 is not in"),
        (["--checkpoint", "newest"], "must be 'best', 'latest' or a checkpoint id"),
    ],
)
def test_play_bad_checkpoint_one_clear_error(trained, capsys, args, text):
    assert P.main([str(trained), *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("mpirl play: error:") and text in err and err.count("\n") == 1


def test_play_not_a_run(tmp_path, capsys):
    assert P.main([str(tmp_path)]) == 2
    assert "not an mpirl run folder" in capsys.readouterr().err


# ---- export: the same actions as mpirl's own forward -------------------------------------------


def _recorded(run_dir, episodes=3, max_steps=0):
    """(cfg, spec, torch net, mpirl's acting net, observations played by it)."""
    cfg = P.run_config(run_dir)
    spec = envs.inspect(cfg.env, cfg.env_kwargs, cfg.wrapper_specs())
    net, q = P.networks(cfg, spec, P.load_weights(run_dir, None)[0])
    env = P.make_env(cfg, spec)
    obs: list = []
    P.play(env, q, episodes, 0, max_steps, say=lambda s: None, observations=obs)
    env.close()
    return cfg, spec, net, q, np.stack(obs)


def _check_export(tmp_path, spec, net, q, obs):
    import torch

    want = q(obs)
    path = P.export(net, spec, tmp_path / "q.pt", "torchscript", {"env": "x"})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.jit's deprecation notice
        ts = torch.jit.load(str(path))
    for batch in (obs, obs[:1]):
        got = ts(torch.from_numpy(np.ascontiguousarray(batch))).detach().numpy()
        np.testing.assert_array_equal(got.argmax(1), q(batch).argmax(1))
        np.testing.assert_allclose(got, q(batch), rtol=1e-4, atol=1e-4)
    if HAVE_ONNX:
        from onnx.reference import ReferenceEvaluator

        path = P.export(net, spec, tmp_path / "q.onnx", "onnx")
        ref = ReferenceEvaluator(str(path))
        got = ref.run(None, {"obs": np.ascontiguousarray(obs)})[0]
        np.testing.assert_array_equal(got.argmax(1), want.argmax(1))
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_export_gives_the_actions_of_mpirls_forward(trained, tmp_path):
    _, spec, net, q, obs = _recorded(trained)
    assert obs.shape == (21, 3)
    _check_export(tmp_path, spec, net, q, obs)


def _image_run(tmp_path, env_id: str) -> Path:
    """A run folder as mpirl leaves one (learner.h5's config_json, best.pt), untrained."""
    from mpirl.agent.qnet import make_learner_q

    run = tmp_path / "run"
    run.mkdir()
    cfg = parse(["--env", env_id, "--dueling"])
    with h5py.File(run / "learner.h5", "w") as f:
        f.attrs["config_json"] = json.dumps(to_dict(cfg))
    spec = envs.inspect(env_id)
    net = make_learner_q(spec, cfg.hidden, cfg.dueling)
    best_model.write(run / "best.pt", net.state_dict(), np.array([0.0]), update=0, env_steps=0)
    return run


@pytest.mark.skipif(not HAVE_IMAGES, reason='needs the images extra: pip install -e ".[images]"')
@pytest.mark.parametrize("env_id", ["MinAtar/Breakout-v1", "ALE/Pong-v5"])
def test_play_and_export_image_runs(tmp_path, env_id, capsys):
    run = _image_run(tmp_path, env_id)
    assert P.main([str(run), "--episodes", "1", "--max-steps", "30"]) == 0
    out = capsys.readouterr().out
    steps = [int(x.split("(")[1].split()[0]) for x in out.splitlines() if x.startswith("episode")]
    assert "weights from best.pt" in out and len(steps) == 1 and 1 <= steps[0] <= 30
    _, spec, net, q, obs = _recorded(run, episodes=1, max_steps=30)
    assert obs.dtype == np.uint8 and obs.shape[1:] == spec.obs_shape
    _check_export(tmp_path, spec, net, q, obs)


# ---- video and the optional extras --------------------------------------------------------------


@pytest.mark.skipif(not HAVE_VIDEO, reason='needs the video extra: pip install -e ".[video]"')
@pytest.mark.parametrize("env_id", ["CartPole-v1", "MinAtar/Breakout-v1"])
def test_video_of_each_episode(tmp_path, env_id):
    if env_id.startswith("MinAtar") and not HAVE_IMAGES:
        pytest.skip("needs the images extra")
    run = _image_run(tmp_path, env_id)
    assert (
        P.main([str(run), "--episodes", "2", "--max-steps", "20", "--video", str(tmp_path / "v")])
        == 0
    )
    videos = sorted((tmp_path / "v").glob("*.mp4"))
    assert len(videos) == 2 and all(v.stat().st_size > 1000 for v in videos)


@pytest.mark.parametrize(
    "missing, args, text",
    [
        ("moviepy", ["--video", "V"], 'needs moviepy (the video extra): pip install -e ".[video]"'),
        ("onnx", ["--export", "q.onnx", "--format", "onnx"], "--format onnx needs onnx"),
    ],
)
def test_missing_extra_one_clear_error(tmp_path, monkeypatch, capsys, missing, args, text):
    run = _image_run(tmp_path, "CartPole-v1")
    monkeypatch.setitem(sys.modules, missing, None)  # find_spec() now says: not installed
    args = [str(tmp_path / a) if a in ("V", "q.onnx") else a for a in args]
    assert P.main([str(run), "--episodes", "1", *args]) == 2
    err = capsys.readouterr().err
    assert text in err and err.count("\n") == 1


# ---- --resume rebuilds the same env -------------------------------------------------------------


@pytest.mark.mpi
def test_resume_rebuilds_the_users_env(trained, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(trained, run)
    with h5py.File(run / "actor-2.h5", "r") as f:
        before = len(f["episodes/ret"])
    steps = json.loads((run / "summary.json").read_text())["env_steps"]
    p = run_mpirl(
        3,
        "--resume",
        str(run),
        "--max-env-steps",
        str(steps + 300),
        "--target-return",
        "none",
        timeout=120,
        env=_env(),
    )  # 300 env steps: ~40 episodes of 7
    assert p.returncode == 0, p.stdout + p.stderr
    with h5py.File(run / "actor-2.h5", "r") as f:
        length, ret = f["episodes/length"][before:], f["episodes/ret"][before:]
        seeds = json.loads(f.attrs["seeds_json"])
    assert len(ret) > 0 and (length == 7).all() and (ret % 2 == 0).all()
    from mpirl import seeds as S

    assert seeds["envs"] == S.actor(5, 2, 0, 1, 4, 1)["envs"]  # fresh episodes after checkpoint 1


# ---- TensorBoard ------------------------------------------------------------------------------


def test_tensorboard_groups_are_the_same_live_and_offline():
    """The live mirror gets rows in flush-sized pieces, the converter all at once: same points."""
    from mpirl.logs.dashboard import Scalars

    rng = np.random.default_rng(0)
    n = 1234
    cols = {
        "t": np.arange(n) * 0.01,
        "update": np.arange(1, n + 1),
        "loss": rng.random(n),
        "td_abs_mean": rng.random(n),
        "beta": np.full(n, 0.4),
    }
    whole = Scalars(100.0)
    a = whole.rows("updates", cols) + whole.finish()
    live = Scalars(100.0)
    b = []
    for lo, hi in ((0, 7), (7, 450), (450, 451), (451, n)):
        b += live.rows("updates", {k: v[lo:hi] for k, v in cols.items()})
    b += live.finish()
    assert a == b
    loss = [x for x in a if x[0] == "train/loss"]
    assert [x[1] for x in loss] == [*range(99, n, 100), n]
    assert loss[0][2] == pytest.approx(cols["loss"][:99].mean())


@pytest.mark.skipif(
    not HAVE_TB, reason='needs the tensorboard extra: pip install -e ".[tensorboard]"'
)
def test_tensorboard_files_readable_live_and_offline(trained, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from analysis import to_tensorboard

    with h5py.File(trained / "learner.h5", "r") as f:
        evals = f["evals/ret_mean"][()]
        updates = f["updates/update"][()]
        windows = f["transfers/window"][()]
        progress = len(f["progress/updates"])  # none if the target came within a second
    assert (windows >= 1).all()  # the buffer's window reached the learner with every batch
    assert to_tensorboard.main([str(trained), "--out", str(tmp_path / "tb")]) == 0
    got = {}
    for name, d in (("live", trained / "tensorboard"), ("offline", tmp_path / "tb")):
        ea = EventAccumulator(str(d))
        ea.Reload()
        tags = set(ea.Tags()["scalars"])
        for tag in (
            "eval/ret_mean",
            "train/loss",
            "link/site0/mb_in_per_s",
            "link/site0/priority_mean",
            "link/site0/window",
            *(["progress/updates_per_s", "progress/recent_return"] if progress else []),
        ):
            assert tag in tags, (name, sorted(tags))
        got[name] = {t: [(e.step, e.value) for e in ea.Scalars(t)] for t in tags}
        assert [v for _, v in got[name]["eval/ret_mean"]] == pytest.approx(evals.tolist())
        assert len(got[name]["train/loss"]) == len(np.unique(updates // 100))
    assert got["live"] == got["offline"]


def test_buffer_tensorboard_scalars_are_the_same_live_and_offline():
    """The buffer's rows in flush-sized pieces or all at once: the same points; NaN left out,
    /site and /link stepped in milliseconds (rows come every half --flush-seconds)."""
    from mpirl.logs.dashboard import SITE, BufferScalars

    rng = np.random.default_rng(1)
    n, k = 250, 40
    batches = {
        "t": np.arange(n) * 0.01,
        "batch": np.arange(n),
        "priority_mean": rng.random(n),
        "max_weight": 1 + rng.random(n),
        "beta": np.full(n, 0.4),
        "size": np.arange(n) * 10,
    }
    site = {"t": 0.5 * np.arange(1, k + 1), **{f: rng.random(k) for f in SITE}}
    site["rtt_s"][::2] = np.nan  # no round trip in those intervals
    link = {
        "t": site["t"],
        "bytes_out": np.arange(k) * 1000,
        "raw_bytes_out": np.arange(k) * 3000,
        "bytes_in": np.full(k, 500),
        "interval_s": np.full(k, 0.5),
        "utilization": rng.random(k),
    }
    whole = BufferScalars(100.0)
    a = (
        whole.rows("site", site)
        + whole.rows("link", link)
        + whole.rows("batches", batches)
        + whole.finish()
    )
    live = BufferScalars(100.0)
    b = []
    for lo, hi in ((0, 3), (3, 20), (20, k)):
        b += live.rows("site", {f: v[lo:hi] for f, v in site.items()})
        b += live.rows("link", {f: v[lo:hi] for f, v in link.items()})
    for lo, hi in ((0, 99), (99, 100), (100, 237), (237, n)):
        b += live.rows("batches", {f: v[lo:hi] for f, v in batches.items()})
    b += live.finish()
    assert sorted(a) == sorted(b)
    by_tag: dict = {}
    for tag, step, value, wall in a:
        by_tag.setdefault(tag, []).append((step, value, wall))
    assert [s for s, _, _ in by_tag["buffer/replay_size"]] == [500 * (i + 1) for i in range(k)]
    assert len(by_tag["buffer/rtt_s"]) == k // 2 and all(
        np.isfinite(v) for _, v, _ in by_tag["buffer/rtt_s"]
    )
    assert by_tag["buffer/link_mb_in_per_s"][0][1] == pytest.approx(500 / 0.5 / 1e6)
    assert [v for _, v, _ in by_tag["buffer/link_compression"]] == pytest.approx([3.0] * (k - 1))
    assert [s for s, _, _ in by_tag["buffer/batch_priority_mean"]] == [99, 199, 249]
    assert by_tag["buffer/batch_max_weight"][0][1] == pytest.approx(
        batches["max_weight"][:100].mean()
    )
    assert by_tag["buffer/batch_size"][-1][1] == 2490  # the group's last
    assert by_tag["buffer/env_steps"][0][2] == pytest.approx(100.5)  # t0_unix + t


@pytest.mark.skipif(
    not HAVE_TB, reason='needs the tensorboard extra: pip install -e ".[tensorboard]"'
)
def test_buffer_statistics_reach_tensorboard_live_and_offline(trained, tmp_path):
    """--tensorboard: the buffer writes its /site, /link and /batches rows into
    tensorboard/buffer-<s> (a TensorBoard run per site), as the converter does from
    buffer-<s>.h5."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from analysis import to_tensorboard

    with h5py.File(trained / "buffer-0.h5", "r") as f:
        replay = f["site/replay_size"][()]
        batches = f["batches/batch"][()]
    assert to_tensorboard.main([str(trained), "--out", str(tmp_path / "tb")]) == 0
    got = {}
    for name, d in (
        ("live", trained / "tensorboard" / "buffer-0"),
        ("offline", tmp_path / "tb" / "buffer-0"),
    ):
        ea = EventAccumulator(str(d))
        ea.Reload()
        tags = set(ea.Tags()["scalars"])
        for tag in (
            "buffer/replay_size",
            "buffer/inserted",
            "buffer/sampled",
            "buffer/prio_applied",
            "buffer/window",
            "buffer/link_mb_out_per_s",
            "buffer/batch_priority_mean",
            "buffer/batch_max_weight",
        ):
            assert tag in tags, (name, sorted(tags))
        assert not any(t.startswith(("train/", "eval/")) for t in tags)  # the learner's: apart
        got[name] = {t: [(e.step, e.value) for e in ea.Scalars(t)] for t in tags}
        assert [v for _, v in got[name]["buffer/replay_size"]] == replay.tolist()
        assert len(got[name]["buffer/batch_beta"]) == len(np.unique(batches // 100))
    assert got["live"] == got["offline"]


def test_tensorboard_without_its_extra_is_a_config_error(monkeypatch):
    from mpirl.logs.dashboard import check_installed
    from mpirl.run.config import ConfigError

    monkeypatch.setitem(sys.modules, "tensorboard", None)
    with pytest.raises(ConfigError, match=r'needs .* pip install -e "\.\[tensorboard\]"'):
        check_installed()
