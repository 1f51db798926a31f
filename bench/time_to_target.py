"""Time to target on CartPole-v1: mpirl (both placements) against Stable-Baselines3's DQN.

    python bench/time_to_target.py [--seeds 0 1 2] [--ranks 9] [--no-sb3] [--max-seconds 600]
                                   [--out FILE.md]

All runs happen one after the other in this one invocation (the machine is shared and noisy: the
ratio between runs of the same invocation is the figure to quote).  For each run: wall time
from launch (process start, so start-up counts) to the first greedy evaluation with mean >= the
target (10 episodes), and env steps by then; median over seeds.

A run that does not reach the target (mpirl within ``--max-seconds``; SB3 within 200,000 env steps
or ``--max-seconds``) is a failure, and failures are never dropped: each one is listed, the table
says how many seeds reached the target, and the medians count a failure as slower than every run
that reached it (so a median that falls on a failure reads "not reached", and so does its ratio).

* mpirl: `mpirun -n RANKS python -m mpirl.main --replay-at {buffer,learner} --seed S`, default
  settings; time to target = the launcher's wall clock when the learner reports the target
  (summary.json, time since the learner loop started, + the start-up measured outside).
* SB3: DQN with the rl-zoo hyperparameters for CartPole-v1 (lr 2.3e-3, batch 64, buffer 100k,
  learning_starts 1000, gamma 0.99, target_update_interval 10, train_freq 256, gradient_steps
  128, exploration_fraction 0.16, final eps 0.04, net [256, 256]), one torch thread, evaluated
  greedily on 10 episodes every 1,000 env steps (the evaluation time counts, as it does for
  mpirl).  Needs `pip install stable-baselines3` (the `bench` extra); skipped if missing.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from mpirl.launch import mpirun_cmd

TARGET = 475.0
MAX_SECONDS = 600


def run_mpirl(
    replay_at: str, seed: int, ranks: int, tmp: Path, max_seconds: float = MAX_SECONDS
) -> dict:
    run_dir = tmp / f"{replay_at}-{seed}"
    t0 = time.monotonic()
    p = subprocess.run(
        [
            *mpirun_cmd(ranks),
            sys.executable,
            "-m",
            "mpirl.main",
            "--replay-at",
            replay_at,
            "--seed",
            str(seed),
            "--run-dir",
            str(run_dir),
            "--max-seconds",
            str(max_seconds),
            "--target-return",
            str(TARGET),
            "--progress-seconds",
            "0",
        ],
        capture_output=True,
        text=True,
        timeout=max_seconds + 120,
    )
    total = time.monotonic() - t0
    if p.returncode:
        raise RuntimeError(p.stdout[-2000:] + p.stderr[-2000:])
    s = json.loads((run_dir / "summary.json").read_text())
    if "time_to_target_s" not in s:
        return {
            "reached": False,
            "seconds": None,
            "env_steps": None,
            "total_s": total,
            "why": f"{s['stop_reason']} after {s['wall_s']:.0f} s, {s['env_steps']:,} env "
            f"steps, best eval {s['best_eval']:.1f}",
        }
    # launch -> learner loop start is start-up (process launch, imports, layout); the stop
    # protocol after the loop (tens of ms) is counted as start-up too, which is conservative.
    startup = total - s["wall_s"]
    return {
        "reached": True,
        "seconds": startup + s["time_to_target_s"],
        "env_steps": s["env_steps_to_target"],
        "total_s": total,
        "startup_s": startup,
    }


SB3_SCRIPT = r"""
import json, sys, time
t_launch = float(sys.argv[2])
max_seconds = float(sys.argv[3])
import numpy as np, torch, gymnasium as gym
from stable_baselines3 import DQN
from stable_baselines3.common.callbacks import BaseCallback
torch.set_num_threads(1)
seed = int(sys.argv[1])
class Eval(BaseCallback):
    def __init__(self):
        super().__init__()
        self.envs = [gym.make("CartPole-v1") for _ in range(10)]
        self.result = None
        self.best = float("-inf")
    def _on_step(self):
        if time.time() - t_launch > max_seconds:
            return False  # not reached within the time cap
        if self.num_timesteps % 1000:
            return True
        rets = []
        for i, e in enumerate(self.envs):
            o, _ = e.reset(seed=10_000 + 7919 * self.num_timesteps + i)
            done, r = False, 0.0
            while not done:
                a, _ = self.model.predict(o, deterministic=True)
                o, rew, term, trunc, _ = e.step(int(a))
                r += rew
                done = term or trunc
            rets.append(r)
        self.best = max(self.best, float(np.mean(rets)))
        if np.mean(rets) >= 475:
            self.result = {"reached": True, "seconds": time.time() - t_launch,
                           "env_steps": self.num_timesteps}
            return False
        return True
cb = Eval()
model = DQN("MlpPolicy", gym.make("CartPole-v1"), learning_rate=2.3e-3, batch_size=64,
            buffer_size=100_000, learning_starts=1000, gamma=0.99, target_update_interval=10,
            train_freq=256, gradient_steps=128, exploration_fraction=0.16,
            exploration_final_eps=0.04, policy_kwargs=dict(net_arch=[256, 256]), seed=seed,
            verbose=0, device="cpu")
model.learn(total_timesteps=200_000, callback=cb)
print(json.dumps(cb.result or {
    "reached": False, "seconds": None, "env_steps": None,
    "why": f"{cb.num_timesteps:,} env steps in {time.time() - t_launch:.0f} s, "
           f"best eval {cb.best:.1f}"}))
"""


def run_sb3(seed: int, max_seconds: float = MAX_SECONDS) -> dict:
    p = subprocess.run(
        [sys.executable, "-c", SB3_SCRIPT, str(seed), str(time.time()), str(max_seconds)],
        capture_output=True,
        text=True,
        timeout=max_seconds + 120,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    if p.returncode:
        raise RuntimeError(p.stderr[-2000:])
    return json.loads(p.stdout.strip().splitlines()[-1])


def median_not_reached_last(values: list) -> float:
    """Median over every seed, a seed that did not reach the target (None) counted as slower
    than any that did (+inf): it can move the median, never vanish from it.  inf = the median
    seed did not reach the target."""
    return float(statistics.median(math.inf if v is None else float(v) for v in values))


def _fmt(v: float, spec: str) -> str:
    return format(v, spec) if math.isfinite(v) else "not reached"


def summary_table(
    results: dict[str, list[dict]], seeds: list[int], reference: str | None = "SB3 DQN"
) -> str:
    """The markdown table of ``results`` (contender -> one result per seed, in ``seeds`` order)
    and one line per run that did not reach the target."""
    ref = None
    if reference in results:
        ref = median_not_reached_last([r["seconds"] for r in results[reference]])
    head = (
        f"| contender | reached | wall s to {TARGET:g} (median) | per seed "
        f"({', '.join(map(str, seeds))}) | env steps (median) |"
    )
    lines = [
        head + (f" x {reference.split()[0]} |" if ref is not None else ""),
        "|---|---|---|---|---|" + ("---|" if ref is not None else ""),
    ]
    failures = []
    for name, rs in results.items():
        med = median_not_reached_last([r["seconds"] for r in rs])
        steps = median_not_reached_last([r["env_steps"] for r in rs])
        per = ", ".join(f"{r['seconds']:.0f}" if r["reached"] else "not reached" for r in rs)
        ok = sum(r["reached"] for r in rs)
        row = f"| {name} | {ok}/{len(rs)} | {_fmt(med, '.1f')} | {per} | {_fmt(steps, ',.0f')} |"
        if ref is not None:
            if math.isfinite(med) and math.isfinite(ref):
                row += f" {med / ref:.2f} |"
            else:
                row += (
                    f" n/a ({'its' if not math.isfinite(med) else 'the reference'} median "
                    "seed did not reach the target) |"
                )
        lines.append(row)
        failures += [
            f"- {name}, seed {seed}: not reached ({r.get('why', 'no detail')})"
            for seed, r in zip(seeds, rs, strict=True)
            if not r["reached"]
        ]
    if failures:
        lines += [
            "",
            (
                "Runs that did not reach the target (counted in the medians as slower "
                "than every run that did):"
            ),
            *failures,
        ]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--ranks", type=int, default=9)
    ap.add_argument("--no-sb3", action="store_true")
    ap.add_argument(
        "--max-seconds",
        type=float,
        default=MAX_SECONDS,
        help="a run that has not reached the target by then is a failure",
    )
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    try:
        import stable_baselines3  # noqa: F401

        have_sb3 = not a.no_sb3
    except ImportError:
        have_sb3 = False
        print("stable-baselines3 not installed: SB3 rows skipped (pip install stable-baselines3)")
    results: dict[str, list[dict]] = {}
    load0 = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        for seed in a.seeds:  # interleave the contenders so drift hits them alike
            for name in ["mpirl buffer", "mpirl learner"] + (["SB3 DQN"] if have_sb3 else []):
                r = (
                    run_sb3(seed, a.max_seconds)
                    if name == "SB3 DQN"
                    else run_mpirl(name.split()[1], seed, a.ranks, Path(tmp), a.max_seconds)
                )
                results.setdefault(name, []).append(r)
                print(json.dumps({"contender": name, "seed": seed, **r}), flush=True)
    load1 = os.getloadavg()
    table = summary_table(results, a.seeds) + (
        f"\n\nLoad average {load0[0]:.2f} at start, {load1[0]:.2f} at the end; "
        f"--max-seconds {a.max_seconds:g}"
    )
    print(table)
    if a.out:
        Path(a.out).write_text(table + "\n")


if __name__ == "__main__":
    main()
