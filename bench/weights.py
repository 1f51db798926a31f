"""Bytes a weight broadcast, broadcasts a second and policy lag, per --weights-encoding.

    python bench/weights.py [--nets cartpole minatar atari] [--updates 100] [--broadcasts 6]
                            [--runs] [--run-seconds 40] [--out FILE.json]

In process (cheap): each network is the learner's own (`mpirl.agent.qnet.make_torch_q`: the CartPole
MLP 64x64, the MinAtar CNN, the Atari Nature CNN), trained with Adam at its usual learning rate
on random batches (Adam moves every parameter by about lr a step whatever the data, so the
change between broadcasts has the size a real run's has) for ``--updates`` updates between
broadcasts.  Each broadcast is encoded as the learner does (`mpirl.transport.weight_sync`): full,
bf16, delta (from the previous rebuilt weights, zstd); reported: bytes a broadcast (delta alone and
with a keyframe every 20), the reduction against full, encode + decode time, and at 0.5 and 10
Mb/s the broadcasts a second the link carries and, with --weights-every auto at share 0.25, the
seconds between broadcasts and the policy lag in seconds it gives (half the interval + one
transfer).

``--runs`` also runs mpirl (CartPole, 3 ranks, 0.2 Mb/s, 20 ms, --weights-every auto, the same
seed) once per encoding for ``--run-seconds`` and reports the logged bytes a broadcast,
broadcasts a second and the median policy lag in updates (``/progress``).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

NETS = {  # env id, Adam lr, batch (Atari: a small batch keeps the CPU bench short)
    "cartpole": ("CartPole-v1", 1e-3, 64),
    "minatar": ("MinAtar/Breakout-v1", 1e-3, 32),
    "atari": ("ALE/Pong-v5", 1e-4, 4),
}
RATES_MBPS = (0.5, 10.0)
SHARE, KEY_EVERY = 0.25, 20


def trajectory(net: str, updates: int, broadcasts: int) -> list[np.ndarray]:
    """The flat weights at ``broadcasts + 1`` broadcasts, ``updates`` Adam steps apart."""
    import torch

    from mpirl.agent import envs
    from mpirl.agent.qnet import make_torch_q

    env_id, lr, batch = NETS[net]
    spec = envs.inspect(env_id)
    shape = spec.obs_shape if spec.image else spec.obs_shape[0]
    torch.manual_seed(0)
    q = make_torch_q(shape, spec.n_actions, (64, 64), False, spec.obs_scale)
    opt = torch.optim.Adam(q.parameters(), lr=lr)
    scale = 255.0 if spec.family == "atari" else 1.0
    out = [q.flat_params()]
    for _ in range(broadcasts):
        for _ in range(updates):
            x = torch.rand(batch, *spec.obs_shape) * scale
            loss = torch.nn.functional.smooth_l1_loss(q(x), torch.randn(batch, spec.n_actions))
            opt.zero_grad()
            loss.backward()
            opt.step()
        out.append(q.flat_params())
    return out


def encodings(ws: list[np.ndarray]) -> dict:
    """Bytes a broadcast and codec time for each encoding over one trajectory."""
    from mpirl.transport import weight_codec as wc
    from mpirl.transport.wire import Tag, Wire

    wire = Wire(np.dtype([("x", "<f4")]), ws[0].size)
    full = wire.weights(ws[-1], 1, 0).nbytes
    bf16 = wire.weights_bf16(wc.to_bf16(ws[-1]), 1, 0).nbytes
    sizes, times, base, err = [], [], ws[0], 0.0
    cache = wc.WeightCache()
    m = wire.unpack(wire.weights(ws[0], 0, 0), Tag.WEIGHTS)
    cache.apply(m.count, m.seq, int(m.a), m.arrays)
    for v, w in enumerate(ws[1:], start=1):
        t0 = time.perf_counter()
        scales, q, rebuilt = wc.encode_delta(w, base)
        buf = wire.weights_delta(scales, q, v - 1, wc.checksum(rebuilt), v, 0)
        m = wire.unpack(buf, Tag.WEIGHTS)
        assert cache.apply(m.count, m.seq, int(m.a), m.arrays)
        times.append(time.perf_counter() - t0)
        sizes.append(buf.nbytes)
        err = max(err, float(np.abs(cache.params - w).max()))
        base = rebuilt
    delta = float(np.mean(sizes))
    amortized = ((KEY_EVERY - 1) * delta + full) / KEY_EVERY
    return {
        "params": int(ws[0].size),
        "full": full,
        "bf16": bf16,
        "delta": delta,
        "delta_keyed": amortized,
        "delta_x": full / delta,
        "delta_keyed_x": full / amortized,
        "codec_ms": 1e3 * float(np.median(times)),
        "max_abs_err": err,
        "step_abs_mean": float(np.mean(np.abs(ws[-1] - ws[-2]))),
    }


def link_table(res: dict) -> dict:
    """Per link rate and encoding: broadcasts/s the link carries, auto's interval, lag (s)."""
    out = {}
    for mbps in RATES_MBPS:
        for enc in ("full", "bf16", "delta_keyed"):
            tx = res[enc] * 8 / (mbps * 1e6)
            interval = tx / SHARE
            out[f"{mbps:g}Mbps/{enc}"] = {
                "broadcasts_per_s": 1 / tx,
                "auto_interval_s": interval,
                "lag_s": interval / 2 + tx,
            }
    return out


def mpirl_run(enc: str, seconds: float) -> dict:
    """One short CartPole run on a 0.2 Mb/s link; /progress figures after the first third."""
    import h5py

    from mpirl.launch import mpirun_cmd

    d = Path(tempfile.mkdtemp(prefix="bench-weights-"))
    cmd = [
        *mpirun_cmd(3),
        sys.executable,
        "-m",
        "mpirl.main",
        "--run-dir",
        str(d / "run"),
        "--max-seconds",
        str(seconds),
        "--target-return",
        "none",
        "--bandwidth-mbps",
        "0.2",
        "--latency-ms",
        "20",
        "--weights-encoding",
        enc,
        "--progress-seconds",
        "2",
        "--checkpoint-seconds",
        "0",
        "--seed",
        "1",
    ]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 180)
    if p.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{p.stderr[-2000:]}")
    with h5py.File(d / "run" / "learner.h5", "r") as f:
        pr = {
            k: f["progress"][k][()]
            for k in (
                "t",
                "weights_bytes",
                "weights_sent",
                "interval_s",
                "lag_median",
                "updates_per_s",
                "weights_interval",
            )
        }
    shutil.rmtree(d, ignore_errors=True)
    steady = pr["t"] >= pr["t"][0] + (pr["t"][-1] - pr["t"][0]) / 3
    return {
        "bytes_per_broadcast": float(
            np.nansum(pr["weights_bytes"][steady] * pr["weights_sent"][steady])
            / max(1, pr["weights_sent"][steady].sum())
        ),
        "broadcasts_per_s": float(
            pr["weights_sent"][steady].sum() / pr["interval_s"][steady].sum()
        ),
        "weights_interval": float(np.nanmedian(pr["weights_interval"][steady])),
        "lag_median_updates": float(np.nanmedian(pr["lag_median"][steady])),
        "updates_per_s": float(np.mean(pr["updates_per_s"][steady])),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nets", nargs="+", default=list(NETS), choices=list(NETS))
    ap.add_argument("--updates", type=int, default=100, help="Adam updates between broadcasts")
    ap.add_argument("--broadcasts", type=int, default=6)
    ap.add_argument("--runs", action="store_true", help="also short mpirl runs per encoding")
    ap.add_argument("--run-seconds", type=float, default=40)
    ap.add_argument("--out", default=None, help="also write the results as JSON here")
    a = ap.parse_args()
    res = {}
    for net in a.nets:
        updates = a.updates if net != "atari" else max(1, a.updates // 5)
        r = encodings(trajectory(net, updates, a.broadcasts))
        r["updates_between"] = updates
        r["links"] = link_table(r)
        res[net] = r
        print(
            f"{net:9s} {r['params']:>9,} params | full {r['full']:>10,} B | bf16 "
            f"{r['bf16']:>10,} B | delta {r['delta']:>10,.0f} B ({r['delta_x']:.1f}x; with a "
            f"keyframe every {KEY_EVERY}: {r['delta_keyed']:,.0f} B, {r['delta_keyed_x']:.1f}x)"
            f" | codec {r['codec_ms']:.1f} ms | max |err| {r['max_abs_err']:.2e} (a step "
            f"moves {r['step_abs_mean']:.1e})",
            flush=True,
        )
        for k, v in r["links"].items():
            print(
                f"    {k:22s} {v['broadcasts_per_s']:8.2f} broadcasts/s | auto every "
                f"{v['auto_interval_s']:7.2f} s | lag {v['lag_s']:7.2f} s"
            )
    if a.runs:
        res["runs_cartpole_0.2mbps"] = {}
        for enc in ("full", "bf16", "delta"):
            r = mpirl_run(enc, a.run_seconds)
            res["runs_cartpole_0.2mbps"][enc] = r
            print(
                f"run {enc:5s}: {r['bytes_per_broadcast']:,.0f} B a broadcast, "
                f"{r['broadcasts_per_s']:.2f} broadcasts/s, every {r['weights_interval']:.0f} "
                f"updates, lag {r['lag_median_updates']:.0f} updates (median), "
                f"{r['updates_per_s']:.0f} updates/s",
                flush=True,
            )
    if a.out:
        Path(a.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
