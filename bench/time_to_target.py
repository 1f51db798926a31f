"""Time to target on CartPole-v1: mpirl (both placements) against Stable-Baselines3's DQN.

    python bench/time_to_target.py [--seeds 0 1 2] [--ranks 9] [--no-sb3] [--out FILE.md]

All runs happen one after the other in this one invocation (the machine is shared and noisy: the
ratio between runs of the same invocation is the figure to quote).  For each run: wall time
from launch (process start, so start-up counts) to the first greedy evaluation with mean >= the
target (10 episodes), and env steps by then; median over seeds.

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
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGET = 475.0
MAX_SECONDS = 600


def mpirun() -> str:
    here = Path(sys.executable).parent / "mpirun"
    return str(here) if here.exists() else (shutil.which("mpirun") or "mpirun")


def run_mpirl(replay_at: str, seed: int, ranks: int, tmp: Path) -> dict:
    run_dir = tmp / f"{replay_at}-{seed}"
    t0 = time.monotonic()
    p = subprocess.run([mpirun(), "-n", str(ranks), sys.executable, "-m", "mpirl.main",
                        "--replay-at", replay_at, "--seed", str(seed), "--run-dir", str(run_dir),
                        "--max-seconds", str(MAX_SECONDS), "--target-return", str(TARGET),
                        "--progress-seconds", "0"], capture_output=True, text=True,
                       timeout=MAX_SECONDS + 120)
    total = time.monotonic() - t0
    if p.returncode:
        raise RuntimeError(p.stdout[-2000:] + p.stderr[-2000:])
    s = json.loads((run_dir / "summary.json").read_text())
    if "time_to_target_s" not in s:
        return {"seconds": float("nan"), "env_steps": float("nan"), "total_s": total}
    # launch -> learner loop start is start-up (process launch, imports, layout); the stop
    # protocol after the loop (tens of ms) is counted as start-up too, which is conservative.
    startup = total - s["wall_s"]
    return {"seconds": startup + s["time_to_target_s"], "env_steps": s["env_steps_to_target"],
            "total_s": total, "startup_s": startup}


SB3_SCRIPT = r"""
import json, sys, time
t_launch = float(sys.argv[2])
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
    def _on_step(self):
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
        if np.mean(rets) >= 475:
            self.result = {"seconds": time.time() - t_launch, "env_steps": self.num_timesteps}
            return False
        return True
cb = Eval()
model = DQN("MlpPolicy", gym.make("CartPole-v1"), learning_rate=2.3e-3, batch_size=64,
            buffer_size=100_000, learning_starts=1000, gamma=0.99, target_update_interval=10,
            train_freq=256, gradient_steps=128, exploration_fraction=0.16,
            exploration_final_eps=0.04, policy_kwargs=dict(net_arch=[256, 256]), seed=seed,
            verbose=0, device="cpu")
model.learn(total_timesteps=200_000, callback=cb)
print(json.dumps(cb.result or {"seconds": float("nan"), "env_steps": float("nan")}))
"""


def run_sb3(seed: int) -> dict:
    p = subprocess.run([sys.executable, "-c", SB3_SCRIPT, str(seed), str(time.time())],
                       capture_output=True, text=True, timeout=MAX_SECONDS + 60,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    if p.returncode:
        raise RuntimeError(p.stderr[-2000:])
    return json.loads(p.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--ranks", type=int, default=9)
    ap.add_argument("--no-sb3", action="store_true")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    try:
        import stable_baselines3  # noqa: F401
        have_sb3 = not a.no_sb3
    except ImportError:
        have_sb3 = False
        print("stable-baselines3 not installed: SB3 rows skipped (pip install stable-baselines3)")
    results: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for seed in a.seeds:  # interleave the contenders so drift hits them alike
            for name in ["mpirl buffer", "mpirl learner"] + (["SB3 DQN"] if have_sb3 else []):
                r = (run_sb3(seed) if name == "SB3 DQN"
                     else run_mpirl(name.split()[1], seed, a.ranks, Path(tmp)))
                results.setdefault(name, []).append(r)
                print(json.dumps({"contender": name, "seed": seed, **r}), flush=True)
    ref = statistics.median(r["seconds"] for r in results["SB3 DQN"]) if have_sb3 else None
    lines = [f"| contender | wall s to {TARGET:g} (median) | per seed | env steps (median) |"
             + (" x SB3 |" if ref else ""),
             "|---|---|---|---|" + ("---|" if ref else "")]
    for name, rs in results.items():
        med = statistics.median(r["seconds"] for r in rs)
        steps = statistics.median(r["env_steps"] for r in rs)
        per = ", ".join(f"{r['seconds']:.0f}" for r in rs)
        lines.append(f"| {name} | {med:.1f} | {per} | {steps:,.0f} |"
                     + (f" {med / ref:.2f} |" if ref else ""))
    table = "\n".join(lines)
    print(table)
    if a.out:
        Path(a.out).write_text(table + "\n")


if __name__ == "__main__":
    main()
