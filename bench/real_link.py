"""The emulated long-haul link against a real, shaped one, at the same rate: both placements.

    python bench/real_link.py [--mbps 1] [--seconds 30] [--ranks 3] [--out FILE.md]

Needs root, ``ip``, ``tc`` and ``unshare`` (tests/netns.py; docs/running.md, "A real shaped
link").  For each placement (``--replay-at learner``, ``buffer``), one after the other:

* **emulated**: ``mpirun -n RANKS`` on this host's loopback with ``--link none
  --bandwidth-mbps MBPS`` (mpirl's own model: bandwidth at the sender, no latency);
* **real**: the learner in a "cloud" network namespace, the buffer and actors in an "edge" one,
  a veth pair between them shaped with tbf to MBPS in both directions, ``--link none``.  The
  real link has no propagation delay either (netem is not available; tbf's latency is its queue
  limit), so both rows are at the same rate and 0 ms.

Reported per run: updates/s (the learner's updates / its wall time), the delivered fraction
(``--replay-at learner``: transitions that reached the learner's memory / env steps), link bytes
(the learner's ``link_bytes_in + link_bytes_out``) and link MB/s, the weights' measured rate
(real: `mpirl.transport.link.AckRate`, last reading of ``MPIRL_LINK_TRACE``), and the 1-minute
load average before and after each run (``os.getloadavg``, as ``uptime`` prints it).  Prints a
markdown table (and writes it to --out).
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

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from netns import RealLink, unavailable  # noqa: E402

from mpirl.launch import mpirun_cmd  # noqa: E402


def _flags(run: Path, placement: str, seconds: float) -> list[str]:
    return [
        sys.executable, "-m", "mpirl.main",
        "--run-dir", str(run), "--replay-at", placement,
        "--max-seconds", str(seconds), "--target-return", "none",
        "--checkpoint-seconds", "0", "--progress-seconds", "2",
    ]  # fmt: skip


def one(prefix: list[str], extra: list[str], run: Path, placement: str, seconds: float) -> dict:
    trace = run.parent / (run.name + "-trace")
    trace.mkdir()
    env = dict(os.environ, MPIRL_LINK_TRACE=str(trace), PYTHONPATH=str(ROOT))
    load0 = os.getloadavg()[0]
    p = subprocess.run(
        [*prefix, *_flags(run, placement, seconds), *extra],
        capture_output=True, text=True, env=env, timeout=seconds + 300,
    )  # fmt: skip
    load1 = os.getloadavg()[0]
    if p.returncode != 0:
        raise SystemExit(f"run {run} failed:\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}")
    s = json.loads((run / "summary.json").read_text())
    rates = trace / "link-0-1.jsonl"
    rate = json.loads(rates.read_text().splitlines()[-1])["rate_bps"] if rates.exists() else None
    nbytes = s["link_bytes_in"] + s["link_bytes_out"]
    return {
        "updates_per_s": s["updates"] / s["wall_s"],
        "delivered": s.get("delivered_fraction"),
        "link_mb": nbytes / 1e6,
        "link_mb_per_s": nbytes / 1e6 / s["wall_s"],
        "env_steps": s["env_steps"],
        "updates": s["updates"],
        "weights_rate_mbps": None if rate is None else rate / 1e6,
        "load": (load0, load1),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mbps", type=float, default=1.0)
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--ranks", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args(argv)
    why = unavailable()
    if why:
        print(f"bench/real_link.py: {why}", file=sys.stderr)
        return 2
    rows = []
    with tempfile.TemporaryDirectory(prefix="mpirl-real-link-") as tmp, RealLink(a.mbps) as link:
        tmp = Path(tmp)
        for placement in ("learner", "buffer"):
            emulated = one(
                mpirun_cmd(a.ranks),
                ["--link", "none", "--bandwidth-mbps", str(a.mbps)],
                tmp / f"{placement}-emulated",
                placement,
                a.seconds,
            )
            real = one(
                link.mpirun_cmd(a.ranks),
                ["--link", "none"],
                tmp / f"{placement}-real",
                placement,
                a.seconds,
            )
            rows += [(placement, "emulated", emulated), (placement, "real (tbf)", real)]
    stamp = time.strftime("%Y-%m-%d %H:%M")
    lines = [
        f"{stamp}, `python bench/real_link.py --mbps {a.mbps:g} --seconds {a.seconds:g} "
        f"--ranks {a.ranks}` ({a.mbps:g} Mb/s, 0 ms, {a.ranks} ranks):",
        "",
        "| replay at | link | updates/s | delivered | link MB | link MB/s | weights rate Mb/s "
        "| load before / after |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for placement, kind, r in rows:
        dl = "-" if r["delivered"] is None else f"{r['delivered']:.3f}"
        wr = "-" if r["weights_rate_mbps"] is None else f"{r['weights_rate_mbps']:.2f}"
        lines.append(
            f"| {placement} | {kind} | {r['updates_per_s']:.1f} | {dl} | {r['link_mb']:.2f} "
            f"| {r['link_mb_per_s']:.3f} | {wr} | {r['load'][0]:.2f} / {r['load'][1]:.2f} |"
        )
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        a.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
