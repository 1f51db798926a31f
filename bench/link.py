"""Learner busy fraction and updates/s across the long-haul link: --inflight 1, K and auto.

    python bench/link.py [--seconds 25] [--ranks 3] [--k 8] [--out docs/bench-link.md]

Every configuration is a real `mpirun` run of mpirl (replay at the buffer, actors unthrottled so
the learner is the bottleneck), one after the other in this one invocation; the reference is the
same run with no emulated link (`--link none`, `--inflight auto`).  Reported: the learner's busy
fraction (time training / wall time) and updates/s over the steady part of the run (after the
first third), and each as a ratio to the reference.  Targets: auto >= 0.9x the
reference's busy fraction on every profile; --inflight 1 visibly below it on the WAN profile.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import h5py
import numpy as np

from mpirl.launch import mpirun_cmd


def one(run_dir: Path, ranks: int, seconds: float, link: str, inflight: str) -> dict:
    cmd = [
        *mpirun_cmd(ranks),
        sys.executable,
        "-m",
        "mpirl.main",
        "--run-dir",
        str(run_dir),
        "--max-seconds",
        str(seconds),
        "--target-return",
        "none",
        "--replay-ratio",
        "0",
        "--link",
        link,
        "--inflight",
        inflight,
        "--progress-seconds",
        "1",
        "--hidden",
        "64",
        "64",
        "--seed",
        "3",
    ]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 120)
    if p.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    with h5py.File(run_dir / "learner.h5", "r") as f:
        t = f["progress/t"][()]
        steady = t >= t[0] + (t[-1] - t[0]) / 3
        busy = float(np.mean(f["progress/busy_fraction"][()][steady]))
        ups = float(np.mean(f["progress/updates_per_s"][()][steady]))
    window = rtt = float("nan")
    with h5py.File(run_dir / "buffer-0.h5", "r") as f:
        if len(f["site/window"]):
            window = float(np.median(f["site/window"][()][-5:]))
            rtt = float(np.nanmedian(f["site/rtt_s"][()][-5:]))
    return {"busy": busy, "updates_per_s": ups, "window": window, "rtt_s": rtt}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=25)
    ap.add_argument("--ranks", type=int, default=3)
    ap.add_argument("--k", default="8", help="the fixed asynchronous window")
    ap.add_argument("--profiles", nargs="+", default=["fiber-10km-25g", "wan-100m-30ms"])
    ap.add_argument("--out", default=None, help="also write the table to this markdown file")
    a = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        ref = one(Path(tmp) / "ref", a.ranks, a.seconds, "none", "auto")
        rows.append(("none (reference)", "auto", ref))
        for prof in a.profiles:
            for inflight in ("1", a.k, "auto"):
                r = one(Path(tmp) / f"{prof}-{inflight}", a.ranks, a.seconds, prof, inflight)
                rows.append((prof, inflight, r))
                print(json.dumps({"link": prof, "inflight": inflight, **r}), flush=True)
    lines = [
        "| link | --inflight | busy fraction | x reference | updates/s | x reference | "
        "window | batch round trip |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for prof, inflight, r in rows:
        lines.append(
            f"| {prof} | {inflight} | {r['busy']:.2f} | {r['busy'] / ref['busy']:.2f} |"
            f" {r['updates_per_s']:.0f} | {r['updates_per_s'] / ref['updates_per_s']:.2f}"
            f" | {r['window']:.0f} | {r['rtt_s'] * 1e3:.1f} ms |"
        )
    table = "\n".join(lines)
    print(table)
    if a.out:
        Path(a.out).write_text(table + "\n")


if __name__ == "__main__":
    main()
