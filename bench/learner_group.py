"""The learner group: global updates/s and samples/s for K = 1, 2, 4 learners in each
--learner-sync mode, with and without one sleep straggler, and parallel efficiency.

    python bench/learner_group.py [--k 1 2 4] [--seconds 30] [--slow 2 4] [--out FILE.md]
    python bench/learner_group.py --learning 6 [--seconds 120]   # gba vs allreduce, returns

Each point is a real `mpirun -n (K + 2) python -m mpirl.main --learners K` run on CartPole-v1
(K learners, one buffer, one actor paced at --actor-rate env steps/s so that it leaves the cores
to the learners), replay at the learner (each learner samples its own shard), --replay-ratio 0
(the learners train as fast as they can), no evaluation during the run.  From the steady state
(the last two thirds of the run, learner.h5's /updates and /group rows):

* global updates/s: optimizer steps of the shared network per second;
* samples/s: transitions whose gradients went into those steps (allreduce and gba: K x batch per
  update minus dropped ones; async and K = 1: batch);
* parallel efficiency: samples/s / (K x samples/s of K = 1 without a straggler).

A straggler is the last learner (learner 0 when K = 1) sleeping in every update so that it is
``f`` times slower: ``--straggle RANK:MS`` with MS = (f - 1) x the update time of K = 1 (measured
first).  ``--learning N`` instead runs gba and allreduce at K = 2 with the 4x straggler for N
seeds each, --seconds each, with evaluation, and reports the last greedy evaluation's return of
each seed and the paired gba - allreduce difference with a 95% paired t-interval.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import h5py
import numpy as np

from mpirl.launch import mpirun_cmd

BATCH = 64


def run(
    run_dir: Path,
    k: int,
    mode: str,
    seconds: float,
    straggle: str | None,
    seed: int = 3,
    actor_rate: float = 400.0,
    evaluate: bool = False,
) -> None:
    cmd = [
        *mpirun_cmd(k + 2),
        sys.executable,
        "-m",
        "mpirl.main",
        "--run-dir",
        str(run_dir),
        "--learners",
        str(k),
        "--learner-sync",
        mode,
        "--replay-at",
        "learner",
        "--replay-ratio",
        "0",
        "--max-seconds",
        str(seconds),
        "--target-return",
        "none",
        "--progress-seconds",
        "0",
        "--seed",
        str(seed),
        "--checkpoint-seconds",
        "0",
        "--actor-steps-per-s",
        str(actor_rate),
        "--batch-size",
        str(BATCH),
        "--eval-every",
        "500" if evaluate else "100000000",
    ]
    if straggle:
        cmd += ["--straggle", straggle]
    p = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        timeout=seconds + 240,
        check=False,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    if p.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")


def rates(run_dir: Path, k: int, mode: str) -> dict:
    """Steady-state global updates/s and samples/s from learner.h5."""
    with h5py.File(run_dir / "learner.h5", "r") as f:
        t = f["updates/t"][()]
        if t.size < 10:
            raise RuntimeError(f"{run_dir}: only {t.size} updates")
        t0 = t[0] + (t[-1] - t[0]) / 3
        steady = t >= t0
        span = t[-1] - t0
        ups = steady.sum() / span
        if k == 1 or mode == "async":
            sps = ups * BATCH
        else:
            gt, n, dropped = (f["group/t"][()], f["group/samples"][()], f["group/dropped"][()])
            sps = n[(gt >= t0) & (dropped == 0)].sum() / span
        last = f["evals/ret_mean"][()]
    return {
        "updates_per_s": float(ups),
        "samples_per_s": float(sps),
        "last_eval": float(last[-1]) if last.size else float("nan"),
    }


def table(rows: list[dict]) -> str:
    out = [
        "| K | sync | straggler | global updates/s | samples/s | parallel efficiency |",
        "|---|---|---|---|---|---|",
    ]
    base = next(r["samples_per_s"] for r in rows if r["k"] == 1 and r["slow"] == 1)
    for r in rows:
        eff = r["samples_per_s"] / (r["k"] * base)
        slow = "none" if r["slow"] == 1 else f"{r['slow']:g}x ({r['ms']:.1f} ms)"
        out.append(
            f"| {r['k']} | {r['mode']} | {slow} | {r['updates_per_s']:.1f} | "
            f"{r['samples_per_s']:,.0f} | {eff:.2f} |"
        )
    return "\n".join(out)


def throughput(args, tmp: Path) -> str:
    rows = []
    run(tmp / "cal", 1, "gba", args.seconds, None)
    base = rates(tmp / "cal", 1, "gba")
    t_update = 1.0 / base["updates_per_s"]
    rows.append({"k": 1, "mode": "-", "slow": 1, "ms": 0.0, **base})
    for slow in args.slow:
        ms = (slow - 1) * t_update * 1000
        for k in args.k:
            modes = ["-"] if k == 1 else args.modes
            for mode in modes:
                if k == 1 and slow == 1:
                    continue
                d = tmp / f"k{k}-{mode}-{slow}"
                straggle = f"{k - 1}:{ms:.2f}" if slow > 1 else None
                run(d, k, "gba" if mode == "-" else mode, args.seconds, straggle)
                rows.append(
                    {
                        "k": k,
                        "mode": mode,
                        "slow": slow,
                        "ms": ms,
                        **rates(d, k, "gba" if mode == "-" else mode),
                    }
                )
                print(
                    f"  K={k} {mode} slow {slow}: {rows[-1]['updates_per_s']:.1f} updates/s, "
                    f"{rows[-1]['samples_per_s']:,.0f} samples/s",
                    file=sys.stderr,
                )
    rows.sort(key=lambda r: (r["slow"], r["k"], r["mode"]))
    return (
        f"{os.cpu_count()} cores; load average before {args.load[0]:.2f}, after "
        f"{os.getloadavg()[0]:.2f}; {args.seconds:g} s per point; update time of K = 1: "
        f"{t_update * 1000:.2f} ms\n\n" + table(rows)
    )


def learning(args, tmp: Path) -> str:
    """gba vs allreduce at K = 2 with a 4x straggler: the last evaluation of each seed."""
    run(tmp / "cal", 1, "gba", min(args.seconds, 20), None)
    ms = 3 * 1000.0 / rates(tmp / "cal", 1, "gba")["updates_per_s"]
    got = {"gba": [], "allreduce": []}
    for seed in range(args.learning):
        for mode, returns in got.items():
            d = tmp / f"{mode}-{seed}"
            run(d, 2, mode, args.seconds, f"1:{ms:.2f}", seed=seed, evaluate=True)
            returns.append(rates(d, 2, mode)["last_eval"])
    from scipy import stats

    diff = np.array(got["gba"]) - np.array(got["allreduce"])
    if np.ptp(diff) == 0:  # every seed the same difference (e.g. both at 500): a point
        lo = hi = float(diff.mean())
    else:  # a t-interval keeps its coverage at n = 6, a bootstrap over 6 pairs does not
        lo, hi = stats.ttest_1samp(diff, 0.0).confidence_interval(0.95)
    lines = ["| seed | gba | allreduce |", "|---|---|---|"]
    lines += [
        f"| {s} | {g:.1f} | {a:.1f} |"
        for s, (g, a) in enumerate(zip(got["gba"], got["allreduce"], strict=True))
    ]
    return (
        "\n".join(lines) + f"\n\ngba - allreduce: {diff.mean():+.1f} (95% paired t-interval "
        f"{lo:+.1f} .. {hi:+.1f}, n = {diff.size}); straggler {ms:.1f} ms per update, "
        f"{args.seconds:g} s per run"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--k", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--modes", nargs="+", default=["allreduce", "async", "gba"])
    ap.add_argument(
        "--slow", type=float, nargs="+", default=[1, 2, 4], help="straggler slow-downs (1 = none)"
    )
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--learning", type=int, default=0, metavar="SEEDS")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if 1 not in args.k or 1 not in args.slow:
        sys.exit("bench/learner_group.py: --k and --slow must include 1 (the baseline)")
    args.load = os.getloadavg()
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="mpirl-group-") as tmp:
        text = (learning if args.learning else throughput)(args, Path(tmp))
    text += f"\n\n({time.monotonic() - t0:.0f} s in all)\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
