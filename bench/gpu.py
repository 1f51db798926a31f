"""GPU learner: updates/s on CPU vs CUDA (MLP and Nature CNN, batch 32/64/256) and time-bounded
MinAtar and Pong pipeline runs with ``--device cuda``, in one invocation, as markdown tables.

    python bench/gpu.py [--seconds 5] [--batches 32 64 256] [--run-seconds 60] [--ranks 9]
                        [--cpu-threads 1] [--out FILE.md]
    python bench/gpu.py --dry-run        # CPU only, tiny counts: checks the paths (CI runs it)

1. **Train step** -- the learner's own ``mpirl.agent.train_step.TrainStep`` in a loop on prepared
   batches of the form the learner receives (structured records; image batches as a frame table plus
   indices, stacked by the learner), for ``--seconds`` per point after a warm-up:

   * ``cpu``: ``--cpu-threads`` torch threads (1 = what a learner rank uses by default);
   * ``cuda serial``: ``TrainStep.step`` (put, update, wait for the priorities) one after another;
   * ``cuda prefetch``: as the learner loop does it: launch the update, put the next batch on its
     way (pinned memory, non-blocking copy), then wait for this update's priorities;
   * ``cuda bf16``: prefetch with ``--amp bf16``.

   Networks: the default MLP (64, 64) on CartPole-shaped input, and the Nature DQN CNN on Atari
   input (4 x 84 x 84 uint8, 6 actions).  The target: CUDA >= 10x CPU updates/s for
   the Nature CNN at batch 32.
2. **Pipeline** -- ``mpirun -n RANKS python -m mpirl.main --env E --device cuda --max-seconds
   --run-seconds --target-return none`` for MinAtar/Breakout-v1 and ALE/Pong-v5 (the images
   extra), replay at the buffer; reported from summary.json and the learner's /progress rows:
   updates/s, env steps/s, busy fraction, best greedy evaluation.  On 16 cores 9 ranks are not
   oversubscribed; the actors' CPU, not the GPU, bounds Pong's env steps.

``--dry-run`` runs everything on CPU with tiny counts (0.15 s per point, batch 32 only, a 2 s
MinAtar pipeline run with ``--device cpu``; Pong is left out), so a machine without CUDA checks
that the script works; its figures mean nothing.  Without CUDA (and no ``--dry-run``) the CUDA
columns say so.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse
import importlib.util
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from mpirl.launch import mpirun_cmd

if TYPE_CHECKING:
    from mpirl.run.config import Config

ROOT = Path(__file__).resolve().parent.parent


def specs():
    """(name, EnvSpec) of the two networks, built without creating an env (no ALE needed)."""
    from mpirl.agent.envs import ATARI_SIZE, ATARI_STACK, EnvSpec

    mlp = EnvSpec((4,), np.dtype(np.float32), 2, 475.0)
    cnn = EnvSpec(
        (ATARI_STACK, ATARI_SIZE, ATARI_SIZE),
        np.dtype(np.uint8),
        6,
        None,
        family="atari",
        frame_shape=(1, ATARI_SIZE, ATARI_SIZE),
        stack=ATARI_STACK,
        obs_scale=1 / 255,
        clip_rewards=True,
    )
    return [("MLP 64x64 (CartPole)", mlp), ("Nature CNN (Atari 4x84x84)", cnn)]


def make_batches(cfg: Config, spec, batch: int, n: int = 4) -> list[tuple]:
    """``n`` batches as the learner receives them: (records, weights, frame table or None)."""
    from mpirl.replay.build import record_dtype

    rng = np.random.default_rng(0)
    out = []
    for _ in range(n):
        rec = np.zeros(batch, record_dtype(cfg, spec))
        rec["action"] = rng.integers(0, spec.n_actions, batch)
        rec["reward"] = rng.normal(size=batch)
        rec["discount"] = np.where(rng.random(batch) < 0.05, 0.0, 0.99**cfg.n_step)
        table = None
        if spec.image:  # each transition: 4 frames for s, the last 4 of s + n for s'
            s, k = spec.stack, cfg.n_step
            table = rng.integers(0, 255, (batch + s + k, *spec.frame_shape), dtype=np.uint8)
            idx = np.arange(batch)[:, None]
            rec["frames"] = np.concatenate([idx + np.arange(s), idx + k + np.arange(s)], axis=1)
        else:
            rec["obs"] = rng.normal(size=rec["obs"].shape)
            rec["next_obs"] = rec["obs"] + rng.normal(0, 0.05, rec["obs"].shape)
        out.append((rec, np.ones(batch, np.float32), table))
    return out


def train_rate(
    cfg: Config, spec, batch: int, device: str, mode: str, seconds: float, amp: str = "off"
) -> float:
    """Updates/s of TrainStep on ``device``: mode 'serial' (step) or 'prefetch' (as the loop)."""
    import torch

    from mpirl.agent.train_step import TrainStep

    step = TrainStep(cfg, spec, device, amp)
    data = make_batches(cfg, spec, batch)
    sync = torch.cuda.synchronize if step.cuda else (lambda: None)

    def loop(budget: float, min_updates: int) -> tuple[int, float]:
        n, t0 = 0, time.monotonic()
        nxt = step.put(*data[0])
        while n < min_updates or time.monotonic() - t0 < budget:
            if mode == "serial":
                rec, w, table = data[n % len(data)]
                step.step(rec, w, table)
            else:
                pending = step.launch(nxt)
                nxt = step.put(*data[(n + 1) % len(data)])
                pending.result()
            n += 1  # (TrainStep copies the target every target_update updates itself)
        sync()
        return n, time.monotonic() - t0

    loop(min(1.0, seconds / 3), 3)  # warm-up: allocations, cuDNN's choices, caches
    n, wall = loop(seconds, 3)
    return n / wall


def step_table(a, cuda: bool) -> list[str]:
    import torch

    from mpirl.run.config import Config

    torch.set_num_threads(a.cpu_threads)
    lines = [
        (
            "| network | batch | cpu updates/s | cuda serial | cuda prefetch | cuda bf16 | "
            "cuda / cpu |"
        ),
        "|---|---|---|---|---|---|---|",
    ]
    for name, spec in specs():
        cfg = Config(batch_size=max(a.batches))
        for batch in a.batches:
            cpu = train_rate(cfg, spec, batch, "cpu", "serial", a.seconds)
            if cuda:
                ser = train_rate(cfg, spec, batch, "cuda", "serial", a.seconds)
                pre = train_rate(cfg, spec, batch, "cuda", "prefetch", a.seconds)
                bf = train_rate(cfg, spec, batch, "cuda", "prefetch", a.seconds, amp="bf16")
                cells = [
                    f"{ser:,.0f}",
                    f"{pre:,.0f}",
                    f"{bf:,.0f}",
                    f"**{max(pre, bf) / cpu:.1f}x**",
                ]
            elif a.dry_run:  # the prefetch path on CPU, so CI runs it
                pre = train_rate(cfg, spec, batch, "cpu", "prefetch", a.seconds)
                cells = ["-", f"{pre:,.0f} (cpu)", "-", "-"]
            else:
                cells = ["no CUDA"] * 3 + ["-"]
            lines.append(f"| {name} | {batch} | {cpu:,.1f} | " + " | ".join(cells) + " |")
            print(lines[-1], flush=True)
    return lines


def pipeline(
    env: str, device: str, seconds: float, ranks: int, tmp: Path, extra: tuple = ()
) -> dict:
    run_dir = tmp / env.replace("/", "-")
    cmd = [
        *mpirun_cmd(ranks),
        sys.executable,
        "-m",
        "mpirl.main",
        "--env",
        env,
        "--device",
        device,
        "--max-seconds",
        str(seconds),
        "--target-return",
        "none",
        "--run-dir",
        str(run_dir),
        "--progress-seconds",
        "2",
        "--checkpoint-seconds",
        "0",
        *extra,
    ]
    p = subprocess.run(
        cmd, capture_output=True, text=True, timeout=seconds + 300, cwd=ROOT, check=False
    )
    if p.returncode:
        raise RuntimeError(
            f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
        )
    import h5py

    s = json.loads((run_dir / "summary.json").read_text())
    with h5py.File(run_dir / "learner.h5", "r", locking=False) as f:
        t = f["progress/t"][()]
        steady = t >= t[0] + (t[-1] - t[0]) / 3 if len(t) > 2 else np.ones(len(t), bool)
        ups = f["progress/updates_per_s"][()][steady]
        eps = f["progress/env_steps_per_s"][()][steady]
        busy = f["progress/busy_fraction"][()][steady]
        dev = f.attrs.get("device_name", "?")
        evals = f["evals/eval_s"][()] if "evals" in f else np.zeros(0)
    return {
        "env": env,
        "device": f"{device} ({dev})",
        "updates": s["updates"],
        "updates_per_s": float(np.mean(ups)) if len(ups) else float("nan"),
        "env_steps_per_s": float(np.mean(eps)) if len(eps) else float("nan"),
        "busy": float(np.mean(busy)) if len(busy) else float("nan"),
        "best_eval": s["best_eval"],
        "evals": len(evals),
        "eval_s": float(np.mean(evals)) if len(evals) else float("nan"),
    }


def pipeline_table(a, cuda: bool) -> list[str]:
    lines = [
        (
            "| env | learner device | ranks | seconds | updates | updates/s (steady) | "
            "env steps/s | learner busy | best eval | evaluations (mean s) |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    have_images = all(importlib.util.find_spec(m) for m in ("minatar", "ale_py", "zstandard"))
    device = "cuda" if cuda else "cpu"
    if not cuda and not a.dry_run:
        return [
            *lines,
            ("| - | no CUDA: pipeline runs skipped (--dry-run runs them on CPU) | | | | | | | | |"),
        ]
    extra = (
        (
            "--replay-capacity",
            "20000",
            "--learning-starts",
            "500",
            "--batch-size",
            "32",
            "--eval-episodes",
            "2",
            "--eval-every",
            "200",
        )
        if a.dry_run
        else ()
    )
    with tempfile.TemporaryDirectory() as tmp:
        for env in ("MinAtar/Breakout-v1", "ALE/Pong-v5"):
            if a.dry_run and env.startswith("ALE/"):
                lines.append(
                    f"| {env} | - | skipped by --dry-run (the MinAtar run checks the "
                    "same path) | | | | | | | |"
                )
                continue
            if not have_images:
                lines.append(
                    f"| {env} | - | images extra not installed: pip install -e "
                    '".[images]" | | | | | | | |'
                )
                continue
            r = pipeline(env, device, a.run_seconds, a.ranks, Path(tmp), extra)
            lines.append(
                f"| {env} | {r['device']} | {a.ranks} | {a.run_seconds:g} | "
                f"{r['updates']:,} | {r['updates_per_s']:,.1f} | "
                f"{r['env_steps_per_s']:,.0f} | {r['busy']:.2f} | "
                f"{r['best_eval']:.1f} | {r['evals']} ({r['eval_s']:.2f}) |"
            )
            print(lines[-1], flush=True)
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=5.0, help="per train-step point")
    ap.add_argument("--batches", type=int, nargs="+", default=[32, 64, 256])
    ap.add_argument("--run-seconds", type=float, default=60.0, help="per pipeline run")
    ap.add_argument("--ranks", type=int, default=9)
    ap.add_argument(
        "--cpu-threads",
        type=int,
        default=1,
        help="torch threads of the CPU points (1 = a learner rank's default)",
    )
    ap.add_argument("--skip-pipeline", action="store_true")
    ap.add_argument(
        "--dry-run", action="store_true", help="CPU only, tiny counts: check that the script runs"
    )
    ap.add_argument("--out", default=None, help="also write the tables to this file")
    a = ap.parse_args(argv)
    import torch

    cuda = torch.cuda.is_available() and not a.dry_run
    if a.dry_run:
        a.seconds, a.batches, a.run_seconds, a.ranks = 0.15, [32], 2.0, 3
    head = (
        f"torch {torch.__version__}, CUDA {torch.version.cuda or '-'}, "
        + (f"{torch.cuda.get_device_name(0)}" if cuda else "no CUDA device")
        + f", {os.cpu_count()} CPU cores"
        + (" (--dry-run: figures mean nothing)" if a.dry_run else "")
    )
    print(head, flush=True)
    text = [head, "", "### Learner train step (updates/s)", "", *step_table(a, cuda)]
    if not a.skip_pipeline:
        text += ["", "### Pipeline runs", "", *pipeline_table(a, cuda)]
    out = "\n".join(text) + "\n"
    print("\n" + out)
    if a.out:
        Path(a.out).write_text(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
