#!/usr/bin/env python
"""Image observations over the long-haul link: throughput and bytes, with and without zstd.

    python bench/images.py [--seconds 40] [--env ALE/Pong-v5] [--link wan-100m-30ms]
                           [--extra-bandwidth-mbps 10] [--out bench-images.md]

Part 1, codecs: Atari frames recorded from the env (random policy) are packed as the link
carries them (a forwarded chunk of 256 transitions; a sampled batch of 32, frames from random
places) and compressed with zstd level 1 (mpirl's choice), zstd 3 and lz4 (if installed).

Part 2, the pipeline: ``mpirun -n 3 python -m mpirl.main`` (1 learner, 1 buffer, 1 actor with 4
envs) on real Atari data under the emulated link, for each placement of the replay memory and
``--compress on/off``; read back from the run's HDF5 files:

* experiences/s through actor -> buffer -> learner: transitions the learner received per second
  (replay_at=learner: forwarded; replay_at=buffer: sampled batches trained on) and env steps/s;
* bytes over the link toward the learner per learner update, on the wire and before compression;
* bytes per experience that reached the learner, on the wire and raw (replay_at=learner: the
  frames-per-transition ratio in bytes; replay_at=buffer: a batch's ~7 frames per transition);
* learner updates/s and the link's peak utilization (busiest ~1 s interval, buffer -> learner).

``--extra-bandwidth-mbps`` adds replay_at=learner runs on a link of that bandwidth (same latency)
where the uncompressed stream does not fit: that is where compression changes throughput, not
only bytes.  Needs the images extra (pip install -e ".[images]").  Results: docs/images.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout


def record_frames(env_id: str, steps: int = 3000) -> np.ndarray:
    from mpirl.agent import envs

    env = envs.make(env_id, seed=0)
    o, _ = env.reset(seed=0)
    frames = [o[-1]]
    for _ in range(steps):
        o, _, term, trunc, _ = env.step(env.action_space.sample())
        frames.append(o[-1])
        if term or trunc:
            o, _ = env.reset()
            frames.append(o[-1])
    env.close()
    return np.stack(frames)


def codecs_table(frames: np.ndarray) -> list[str]:
    import zstandard

    rng = np.random.default_rng(0)
    idx = rng.integers(3, len(frames) - 4, 32)
    payloads = {
        "forwarded chunk (256 transitions, ~1.1 frames each)": frames[500 : 500 + 282].tobytes(),
        "sampled batch (32 transitions, 7 frames each)": np.concatenate(
            [frames[i - 3 : i + 4] for i in idx]
        ).tobytes(),
    }
    codecs = [
        (
            "zstd-1 (mpirl)",
            zstandard.ZstdCompressor(level=1).compress,
            zstandard.ZstdDecompressor().decompress,
        ),
        (
            "zstd-3",
            zstandard.ZstdCompressor(level=3).compress,
            zstandard.ZstdDecompressor().decompress,
        ),
    ]
    try:
        import lz4.frame

        codecs.append(("lz4", lz4.frame.compress, lz4.frame.decompress))
    except ImportError:
        pass
    rows = [
        "| payload | codec | raw KB | ratio | compress MB/s | decompress MB/s |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for name, data in payloads.items():
        for cname, comp, decomp in codecs:
            n, t0 = 0, time.perf_counter()
            while time.perf_counter() - t0 < 0.5:
                out = comp(data)
                n += 1
            tc = (time.perf_counter() - t0) / n
            n, t0 = 0, time.perf_counter()
            while time.perf_counter() - t0 < 0.5:
                decomp(out)
                n += 1
            td = (time.perf_counter() - t0) / n
            rows.append(
                f"| {name} | {cname} | {len(data) / 1e3:,.0f} | "
                f"{len(data) / len(out):,.1f} | {len(data) / tc / 1e6:,.0f} | "
                f"{len(data) / td / 1e6:,.0f} |"
            )
    return rows


def run_pipeline(env_id, replay_at, compress, link, seconds, extra=()) -> dict:
    import h5py

    from mpirl.launch import mpirun_cmd

    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        cmd = [
            *mpirun_cmd(3),
            sys.executable,
            "-m",
            "mpirl.main",
            "--env",
            env_id,
            "--replay-at",
            replay_at,
            "--compress",
            compress,
            "--link",
            link,
            "--max-seconds",
            str(seconds),
            "--target-return",
            "none",
            "--learning-starts",
            "500",
            "--batch-size",
            "32",
            "--replay-capacity",
            "20000",
            "--eval-every",
            "100000000",
            "--eval-episodes",
            "1",
            "--eval-max-steps",
            "20",
            "--progress-seconds",
            "0",
            "--replay-ratio",
            "0",
            "--run-dir",
            str(run_dir),
            *extra,
        ]
        p = subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            timeout=seconds + 300,
            cwd=Path(__file__).resolve().parents[1],
        )
        if p.returncode:
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
        summary = json.loads((run_dir / "summary.json").read_text())
        with h5py.File(run_dir / "learner.h5", "r") as f:
            n = f["transfers/n"][()]
            t = f["transfers/t"][()]
            x_bytes, x_raw = f["transfers/nbytes"][()], f["transfers/raw_nbytes"][()]
            loop0 = float(f.attrs["loop_start_t"])
        with h5py.File(run_dir / "buffer-0.h5", "r") as f:
            out_bytes = int(f.attrs["link_bytes_out"])
            raw_bytes = int(f.attrs["link_raw_bytes_out"])
            util = f["link/utilization"][:-1]  # the last row is the short closing interval
    wall = summary["wall_s"]
    # transitions the learner received per second, from its first arrival to the stop
    span = max(1e-9, loop0 + wall - (t[0] if len(t) else loop0))
    return {
        "replay_at": replay_at,
        "compress": compress,
        "link": link,
        "env_steps_per_s": summary["env_steps"] / wall,
        "received_per_s": float(n.sum()) / span if len(n) else 0.0,
        "updates": summary["updates"],
        "updates_per_s": summary["updates"] / wall,
        "bytes_per_update": out_bytes / max(1, summary["updates"]),
        "raw_bytes_per_update": raw_bytes / max(1, summary["updates"]),
        "ratio": raw_bytes / max(1, out_bytes),
        "bytes_per_experience": float(x_bytes.sum() / max(1, n.sum())),
        "raw_bytes_per_experience": float(x_raw.sum() / max(1, n.sum())),
        "peak_utilization": float(util.max()) if len(util) else float("nan"),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--env", default="ALE/Pong-v5")
    ap.add_argument("--link", default="wan-100m-30ms")
    ap.add_argument("--seconds", type=float, default=40)
    ap.add_argument(
        "--extra-bandwidth-mbps",
        type=float,
        default=10,
        help="also run replay_at=learner on a link this slow (0 = skip)",
    )
    ap.add_argument("--skip-pipeline", action="store_true")
    ap.add_argument("--out", default=None, help="also write the tables to this file")
    args = ap.parse_args()

    lines = [
        f"# bench/images.py, {time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} cores, "
        f"env {args.env}",
        "",
    ]
    frames = record_frames(args.env)
    lines += ["## Codecs on recorded frames", ""] + codecs_table(frames) + [""]
    print("\n".join(lines), flush=True)
    if not args.skip_pipeline:
        runs = [(ra, c, args.link, ()) for ra in ("learner", "buffer") for c in ("off", "on")]
        if args.extra_bandwidth_mbps:
            bw = ("--bandwidth-mbps", str(args.extra_bandwidth_mbps))
            runs += [
                ("learner", c, f"{args.link} at {args.extra_bandwidth_mbps:g} Mb/s", bw)
                for c in ("off", "on")
            ]
        rows = [
            "| replay at | link | compress | env steps/s | experiences/s to learner | "
            "updates/s | link bytes/update (wire) | before compression | bytes/experience "
            "(wire / raw) | peak link utilization |",
            "|---|---|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        print("\n".join(rows), flush=True)
        for ra, c, link_name, extra in runs:
            r = run_pipeline(args.env, ra, c, args.link, args.seconds, extra)
            row = (
                f"| {ra} | {link_name} | {c} | {r['env_steps_per_s']:,.0f} | "
                f"{r['received_per_s']:,.0f} | {r['updates_per_s']:,.1f} | "
                f"{r['bytes_per_update'] / 1e3:,.1f} KB | "
                f"{r['raw_bytes_per_update'] / 1e3:,.1f} KB | "
                f"{r['bytes_per_experience']:,.0f} / {r['raw_bytes_per_experience']:,.0f} | "
                f"{r['peak_utilization']:.0%} |"
            )
            rows.append(row)
            print(row, flush=True)
        lines += ["## Pipeline: mpirun -n 3, 1 actor x 4 envs, batch 32, replay ratio 0", ""]
        lines += rows + [""]
    if args.out:
        Path(args.out).write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
