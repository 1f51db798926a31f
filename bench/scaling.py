"""Scaling with the number of actors: env steps/s and learner updates/s for 1, 2, 4, 7 actors.

    python bench/scaling.py [--actors 1 2 4 7] [--seconds 30] [--profile] [--out FILE.md]

Each point is a real `mpirun -n (actors + 2) python -m mpirl.main` run on CartPole-v1 (learner,
one buffer, the actors; replay at the buffer, no emulated link), for --seconds, in two modes:

* default: the shipped settings, so the replay-ratio token control (4 sampled transitions per
  inserted one) paces the actors to what the learner trains on;
* unthrottled: `--replay-ratio 0`, so the actors run as fast as the machine lets them and the
  learner trains as fast as it can on whatever has arrived.

Reported from the steady state (the last two thirds of the run, from the learner's progress
stream and the actors' own streams): env steps/s, updates/s, the learner's busy fraction (time in
train steps / wall time), and the share of the actors' time spent waiting for tokens.  Also the
number of CPU cores, since on a machine with fewer cores than ranks the ranks share them and the
curve flattens where the cores run out, not where the design does.

--profile additionally runs the 7-actor default point with MPIRL_PROFILE=1 and prints the top
functions (own time) of the learner, the buffer and one actor, which is what docs/benchmarks.md
uses to explain where the time goes.
"""

from __future__ import annotations

import argparse
import io
import os
import pstats
import subprocess
import sys
import tempfile
from pathlib import Path

import h5py
import numpy as np

from mpirl.launch import mpirun_cmd


def one(run_dir: Path, actors: int, seconds: float, throttled: bool, profile: bool = False) -> dict:
    cmd = [
        *mpirun_cmd(actors + 2),
        sys.executable,
        "-m",
        "mpirl.main",
        "--run-dir",
        str(run_dir),
        "--max-seconds",
        str(seconds),
        "--target-return",
        "none",
        "--progress-seconds",
        "1",
        "--seed",
        "3",
        "--checkpoint-seconds",
        "0",
    ]
    if not throttled:
        cmd += ["--replay-ratio", "0"]
    env = {**os.environ, **({"MPIRL_PROFILE": "1"} if profile else {})}
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 180, env=env)
    if p.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    with h5py.File(run_dir / "learner.h5", "r") as f:
        t = f["progress/t"][()]
        steady = t >= t[0] + (t[-1] - t[0]) / 3
        t0, t1 = t[steady][0], t[-1]
        steps = f["progress/env_steps"][()][steady]
        upd = f["progress/updates"][()][steady]
        busy = float(np.mean(f["progress/busy_fraction"][()][steady]))
    waited = 0.0
    for path in sorted(run_dir.glob("actor-*.h5")):
        with h5py.File(path, "r") as f:
            at, thr = f["actor/t"][()], f["actor/throttled_s"][()]
            sel = (at >= t0) & (at <= t1)
            if sel.sum() >= 2:
                waited += (thr[sel][-1] - thr[sel][0]) / (at[sel][-1] - at[sel][0])
    span = t1 - t0
    return {
        "actors": actors,
        "mode": "default" if throttled else "unthrottled",
        "env_steps_per_s": (steps[-1] - steps[0]) / span,
        "updates_per_s": (upd[-1] - upd[0]) / span,
        "busy": busy,
        "actor_waiting": waited / actors,
    }


def top(path: Path, n: int = 12) -> str:
    out = io.StringIO()
    st = pstats.Stats(str(path), stream=out)
    st.strip_dirs().sort_stats("tottime").print_stats(n)
    lines = out.getvalue().splitlines()
    start = next(i for i, line in enumerate(lines) if "ncalls" in line)
    return "\n".join(lines[start : start + n + 1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--actors", type=int, nargs="+", default=[1, 2, 4, 7])
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument(
        "--modes", nargs="+", default=["default", "unthrottled"], choices=["default", "unthrottled"]
    )
    ap.add_argument("--profile", action="store_true", help="also profile the 7-actor default run")
    ap.add_argument("--out", default=None, help="also write the tables to this markdown file")
    a = ap.parse_args()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for mode in a.modes:
            for k in a.actors:
                r = one(Path(tmp) / f"{mode}-{k}", k, a.seconds, mode == "default")
                rows.append(r)
                print(r, flush=True)
        prof = ""
        if a.profile:
            d = Path(tmp) / "profile"
            one(d, max(a.actors), a.seconds, True, profile=True)
            for name in ["learner", "buffer-0", "actor-2"]:
                prof += f"\n### {name} (top {12} by own time, {a.seconds:g} s run)\n\n```\n"
                prof += top(d / f"profile-{name}.pstats") + "\n```\n"
    lines = [
        f"{cores} CPU cores, {a.seconds:g} s per point, ranks = actors + 2",
        "",
        "| mode | actors | ranks | env steps/s | x 1 actor | updates/s | learner busy | "
        "actors waiting for tokens |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for mode in a.modes:
        base = next(r for r in rows if r["mode"] == mode)["env_steps_per_s"]
        for r in (r for r in rows if r["mode"] == mode):
            lines.append(
                f"| {mode} | {r['actors']} | {r['actors'] + 2} | "
                f"{r['env_steps_per_s']:,.0f} | {r['env_steps_per_s'] / base:.2f} | "
                f"{r['updates_per_s']:.0f} | {r['busy']:.2f} | {r['actor_waiting']:.2f} |"
            )
    text = "\n".join(lines) + "\n" + prof
    print(text)
    if a.out:
        Path(a.out).write_text(text)


if __name__ == "__main__":
    main()
