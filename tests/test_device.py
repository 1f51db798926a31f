"""The learner's device (--device, --amp), the prefetching train step, the evaluation runners and
bench/gpu.py.  Everything here runs on CPU; the CUDA tests skip cleanly without a GPU."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from mpirun import run_mpirl

from mpirl.agent.envs import inspect
from mpirl.agent.train_step import TrainStep
from mpirl.run import checkpoint as ck
from mpirl.run.config import Config, ConfigError, parse, to_dict
from mpirl.transport.wire import transition_dtype

ROOT = Path(__file__).resolve().parent.parent
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _batches(n: int, size: int = 32, seed: int = 0):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        rec = np.zeros(size, transition_dtype((4,), np.float32))
        rec["obs"] = rng.normal(size=(size, 4))
        rec["next_obs"] = rng.normal(size=(size, 4))
        rec["action"] = rng.integers(0, 2, size)
        rec["reward"] = rng.normal(size=size)
        rec["discount"] = 0.9
        out.append((rec, rng.random(size).astype(np.float32)))
    return out


def _step(device="cpu", amp="off", seed=0, **kw) -> TrainStep:
    cfg = Config(**{"hidden": (16, 16), "lr": 1e-2, "grad_clip": 0.5, **kw})
    torch.manual_seed(seed)
    return TrainStep(cfg, inspect(cfg.env), device, amp)


def test_config_checks_device_and_amp():
    for bad in ("gpu", "cuda:x", "cuda:", "CPU"):
        with pytest.raises(ConfigError, match="device="):
            Config(device=bad).validate()
    with pytest.raises(ConfigError, match="amp='bf16' needs the learner on CUDA"):
        Config(device="cpu", amp="bf16").validate()
    Config(device="cuda:1", amp="bf16").validate()  # the host is checked at launch, not here


def test_resume_may_move_the_learner_to_another_device(tmp_path):
    stored = to_dict(parse(["--device", "cuda", "--amp", "bf16"]))
    cfg = parse(
        ["--resume", str(tmp_path), "--device", "cpu", "--amp", "off", "--evaluator", "inline"],
        stored=stored,
    )
    assert (cfg.device, cfg.amp, cfg.evaluator) == ("cpu", "off", "inline")


def test_prefetched_updates_equal_serial_ones():
    """launch / put the next / result (the learner loop) trains exactly as step() in a row."""
    data = _batches(6)
    a, b = _step(), _step()
    serial = [a.step(rec, w) for rec, w in data]
    out = []
    nxt = b.put(*data[0])
    for i in range(len(data)):
        pending = b.launch(nxt)
        if i + 1 < len(data):
            nxt = b.put(*data[i + 1])
        out.append(pending.result())
    for (l1, td1), (l2, td2) in zip(serial, out, strict=True):
        assert l1 == l2 and np.array_equal(td1, td2)
    np.testing.assert_array_equal(a.online.flat_params(), b.online.flat_params())


def test_clip_is_torchs_clip_grad_norm():
    s = _step(grad_clip=0.05)
    rec, w = _batches(1)[0]
    loss, _ = s._loss(s.put(rec, w))
    loss.backward()
    ref = [p.grad.clone() for p in s.params]
    params = [torch.nn.Parameter(torch.zeros_like(g)) for g in ref]
    for p, g in zip(params, ref, strict=True):
        p.grad = g.clone()
    torch.nn.utils.clip_grad_norm_(params, 0.05)
    s._clip()
    norm = torch.linalg.vector_norm(torch.stack([g.norm() for g in ref]))
    assert norm > 0.05  # the clip is active in this batch
    for p, q in zip(s.params, params, strict=True):
        torch.testing.assert_close(p.grad, q.grad)


def _cuda_tagged_save(monkeypatch):
    """torch.save as on a GPU: every storage is tagged 'cuda:0' (what a CUDA learner writes);
    loading it without map_location on a CPU-only torch fails."""
    import torch.serialization as ser

    real = ser.location_tag
    monkeypatch.setattr(
        ser, "location_tag", lambda storage: "cuda:0" if real(storage) == "cpu" else real(storage)
    )


def test_checkpoint_written_on_a_gpu_resumes_on_cpu(tmp_path, monkeypatch):
    """The learner's part as a CUDA learner writes it (storages tagged cuda:0) loads through
    mpirl.run.checkpoint (map_location=cpu, weights_only=True) into a CPU TrainStep, and the resumed
    step trains exactly as the original."""
    data = _batches(4)
    a = _step()
    for rec, w in data[:2]:
        a.step(rec, w)
    state = {
        "online": a.online.state_dict(),
        "target": a.target.state_dict(),
        "optimizer": a.opt.state_dict(),
        "torch_rng": torch.get_rng_state(),
    }
    with monkeypatch.context() as m:
        _cuda_tagged_save(m)
        ck.write_part(tmp_path, 1, "learner", {"updates": 2}, None, state)
    ck.write_manifest(tmp_path, 1, ["learner"], {"config": {}, "world_size": 3, "layout": []})
    raw = next(tmp_path.rglob("learner.pt"))
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="CUDA"):
            torch.load(raw, weights_only=True)  # the file really says cuda
    part = ck.load_part(tmp_path, ck.select(tmp_path)[0], "learner")
    b = _step(seed=1)
    b.online.load_state_dict(part.torch["online"])
    b.target.load_state_dict(part.torch["target"])
    b.opt.load_state_dict(part.torch["optimizer"])
    for rec, w in data[2:]:
        assert a.step(rec, w)[0] == b.step(rec, w)[0]
    np.testing.assert_array_equal(a.online.flat_params(), b.online.flat_params())


@pytest.mark.mpi
def test_bad_cuda_device_is_one_error_from_rank_0(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this host has CUDA")
    p = run_mpirl(3, "--device", "cuda", "--run-dir", str(tmp_path / "run"), timeout=120)
    assert p.returncode != 0
    assert p.stderr.count("mpirl: error: device='cuda'") == 1, p.stderr
    assert "--device cpu" in p.stderr
    assert not (tmp_path / "run").exists()  # refused before anything was written


@pytest.mark.parametrize("kind", ["inline", "thread", "process"])
def test_evaluation_runners_agree(kind):
    """Each runner plays the same seeded episodes: a balancing policy scores 500 in each, and a
    zero network (always action 0) the same short returns whatever runs it."""
    sys.path.insert(0, str(ROOT / "bench"))
    from evaluation import balancing_params

    from mpirl.agent.qnet import n_params
    from mpirl.roles.evaluation import make_runner

    cfg = Config(eval_episodes=3)
    spec = inspect(cfg.env)
    r = make_runner(kind, cfg, spec)
    try:
        got = []
        for rnd, flat in enumerate(
            [balancing_params(cfg.hidden), np.zeros(n_params(4, 2, cfg.hidden, False), np.float32)]
        ):
            r.request(flat, rnd, 100 * rnd, 7)
            assert r.busy
            with pytest.raises(RuntimeError, match="in flight"):
                r.request(flat, rnd, 0, 0)
            for _ in range(3000):
                res = r.poll()
                if res is not None:
                    break
                import time

                time.sleep(0.005)
            assert res is not None and not r.busy
            assert (res.round, res.update, res.env_steps) == (rnd, 100 * rnd, 7)
            assert res.eval_s > 0 and np.array_equal(res.params, flat)  # a copy: see request()
            got.append(res.returns)
    finally:
        r.close()
    assert (got[0] == 500).all()
    from mpirl.agent.envs import Evaluator
    from mpirl.agent.qnet import NumpyQ

    ev = Evaluator(cfg.env, 3, seed=cfg.seed)
    ev.round = 1
    q = NumpyQ(4, 2, cfg.hidden, False)
    np.testing.assert_array_equal(got[1], ev.run(q))
    ev.close()


@pytest.mark.mpi
def test_gpu_bench_dry_run():
    """bench/gpu.py --dry-run: the CUDA bench's code paths on CPU (tiny counts)."""
    p = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "gpu.py"), "--dry-run"],
        capture_output=True,
        text=True,
        timeout=400,
        cwd=ROOT,
        check=False,
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "| Nature CNN (Atari 4x84x84) | 32 |" in p.stdout
    assert "### Pipeline runs" in p.stdout


# ---- CUDA only ---------------------------------------------------------------------------------


@CUDA
@pytest.mark.parametrize("amp", ["off", "bf16"])
def test_cuda_train_step_follows_cpu(amp):
    data = _batches(5)
    a, b = _step(), _step(device="cuda", amp=amp)
    for rec, w in data:
        la, _ = a.step(rec, w)
        lb, _ = b.step(rec, w)
    tol = 1e-4 if amp == "off" else 5e-2
    np.testing.assert_allclose(lb, la, rtol=tol * 10, atol=tol)
    np.testing.assert_allclose(
        b.online.flat_params(), a.online.flat_params(), rtol=tol * 10, atol=tol
    )


@CUDA
def test_cpu_checkpoint_resumes_on_cuda(tmp_path):
    data = _batches(4)
    a = _step()
    for rec, w in data[:2]:
        a.step(rec, w)
    state = {
        "online": a.online.state_dict(),
        "target": a.target.state_dict(),
        "optimizer": a.opt.state_dict(),
        "torch_rng": torch.get_rng_state(),
    }
    ck.write_part(tmp_path, 1, "learner", {"updates": 2}, None, state)
    ck.write_manifest(tmp_path, 1, ["learner"], {"config": {}, "world_size": 3, "layout": []})
    part = ck.load_part(tmp_path, ck.select(tmp_path)[0], "learner")
    b = _step(device="cuda", seed=1)
    b.online.load_state_dict(part.torch["online"])
    b.target.load_state_dict(part.torch["target"])
    b.opt.load_state_dict(part.torch["optimizer"])
    assert b.opt.steps[0].device.type == "cuda"
    for rec, w in data[2:]:
        np.testing.assert_allclose(b.step(rec, w)[0], a.step(rec, w)[0], rtol=1e-3)
    again = copy.deepcopy(b.online.state_dict())
    assert all(t.device.type == "cuda" for t in again.values())


@pytest.mark.mpi
@CUDA
def test_cuda_end_to_end(tmp_path):
    p = run_mpirl(
        3,
        "--device",
        "cuda",
        "--run-dir",
        str(tmp_path / "run"),
        "--max-seconds",
        "10",
        "--target-return",
        "none",
        "--learning-starts",
        "200",
        timeout=180,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    assert "learner on cuda" in p.stdout
    import h5py

    with h5py.File(tmp_path / "run" / "learner.h5", "r") as f:
        assert f.attrs["device"].startswith("cuda") and f.attrs["torch_cuda"]
        assert len(f["updates/loss"]) > 50
