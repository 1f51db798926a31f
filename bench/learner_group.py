"""The learner group under stragglers: global updates/s and samples/s for K = 1, 2 (and 4 where
the cores exist) learners in each --learner-sync mode, without a straggler and with one learner
2x and 4x slower, that learner the lead (learner 0) or another; repeated, each point a mean with
a 95% t-interval and its ratio to allreduce's in the same invocation.

    python bench/learner_group.py [--k 1 2 4] [--modes allreduce async gba switch] \
        [--slow 2 4] [--on lead other] [--repeats 3] [--seconds 5] [--out FILE.md]
    python bench/learner_group.py --quick        # a smoke run: K = 1, 2, two modes, ~2 min

The default full run is 23 points x 3 repeats = 69 runs of 5 s each plus start-up and shutdown,
~5 s a run on the quiet 2-core development machine (its 2026-12-02 run: 524 s for 22 runs of
20 s): ~11.5 minutes (K = 4 is skipped there). Under a load of 6-9 a run took ~8 s more than its
--max-seconds (--quick: 12 runs of 3 s in 136 s), which would make it ~15 minutes.

Each run is a real ``mpirun -n (K + 2) python -m mpirl.main --learners K`` on CartPole-v1 (K
learners, one buffer, one actor paced at --actor-rate env steps/s so that it leaves the cores to
the learners), replay at the learner (each learner samples its own shard), --replay-ratio 0 (the
learners train as fast as they can), no evaluation.  From the steady state, the second half of
the run on learner.h5's clock (--learner-sync switch goes GBA at the earliest 2 s after its
start: `mpirl.agent.gba.SwitchRule`'s hold):

* global updates/s: /updates rows (optimizer steps of the shared network) per second;
* samples/s: transitions whose gradients went into those steps: K = 1, batch x updates; K > 1,
  /group's ``samples`` of the contributions not dropped (allreduce: K x batch per update);
* parallel efficiency: samples/s / (K x the samples/s of K = 1 without a straggler).

K learners are run only where ``os.cpu_count() >= K`` (a core per learner); a skipped K is said
in the output.  A straggler sleeps in every update so that it is ``f`` times slower:
``--straggle RANK:MS`` with MS = (f - 1) x the update time of K = 1 without a straggler
(measured first, its repeats back to back; every other point is then run once per repeat, in
order, so that the repeats of two modes are paired in time).  ``lead`` is RANK 0 (the learner
that also talks to the buffer, aggregates GBA / async gradients and evaluates), ``other`` is
RANK K - 1.  The ratio to allreduce (same K, straggler and target) is the geometric mean of the
per-repeat ratios with a 95% t-interval on their logs.  Beside each row: the 1-minute load
average (``os.getloadavg()``) after each of its runs, min-max.
"""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import h5py
import numpy as np
from scipy import stats

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mpirl.launch import mpirun_cmd  # noqa: E402

BATCH = 64
MODES = ("allreduce", "async", "gba", "switch")
#: K = 1 has no --learner-sync mode of its own (one learner steps alone); it runs as this
SOLO = "gba"


@dataclass(frozen=True)
class Point:
    """One configuration: K learners, a mode ("-" for K = 1), the straggler's slow-down (1 =
    none) and which learner straggles ("lead": 0, "other": K - 1; "-" without one)."""

    k: int
    mode: str
    slow: float
    on: str

    def straggle(self, ms: float) -> str | None:
        """The --straggle value, or None without a straggler."""
        if self.slow == 1:
            return None
        rank = 0 if self.on == "lead" else self.k - 1
        return f"{rank}:{ms:.3f}"

    def label(self, ms: float) -> str:
        if self.slow == 1:
            return "none"
        who = "lead (0)" if self.on == "lead" else f"other ({self.k - 1})"
        return f"{self.slow:g}x on {who}, {ms:.1f} ms"


@dataclass
class Runs:
    """Every repeat of one point: its rates, in repeat order, and the load after each."""

    point: Point
    updates: list[float] = field(default_factory=list)
    samples: list[float] = field(default_factory=list)
    load: list[float] = field(default_factory=list)
    first_gba: list[float] = field(default_factory=list)  # switch: when it first went GBA


def command(
    run_dir: Path, p: Point, seconds: float, ms: float, actor_rate: float, seed: int
) -> list[str]:
    """The mpirun command line of one run of ``p``."""
    cmd = [
        *mpirun_cmd(p.k + 2),
        sys.executable, "-m", "mpirl.main",
        "--run-dir", str(run_dir),
        "--learners", str(p.k),
        "--learner-sync", SOLO if p.k == 1 else p.mode,
        "--replay-at", "learner",
        "--replay-ratio", "0",
        "--max-seconds", str(seconds),
        "--target-return", "none",
        "--progress-seconds", "0",
        "--seed", str(seed),
        "--checkpoint-seconds", "0",
        "--actor-steps-per-s", str(actor_rate),
        "--batch-size", str(BATCH),
        "--eval-every", "100000000",
    ]  # fmt: skip
    straggle = p.straggle(ms)
    return cmd + (["--straggle", straggle] if straggle else [])


def run(cmd: list[str], seconds: float) -> None:
    """One run; RuntimeError with its output's tail when it fails."""
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


def rates(run_dir: Path, k: int) -> tuple[float, float, float]:
    """Steady-state (second half) global updates/s and samples/s from learner.h5, and when the
    group first went GBA (NaN: never, or not --learner-sync switch)."""
    with h5py.File(run_dir / "learner.h5", "r") as f:
        t = f["updates/t"][()]
        if t.size < 10:
            raise RuntimeError(f"{run_dir}: only {t.size} updates")
        t0 = t[0] + (t[-1] - t[0]) / 2
        span = float(t[-1] - t0)
        ups = float((t >= t0).sum()) / span
        if k == 1:
            sps = ups * BATCH
        else:
            gt, n, dropped = f["group/t"][()], f["group/samples"][()], f["group/dropped"][()]
            sps = float(n[(gt >= t0) & (dropped == 0)].sum()) / span
        first = math.nan
        if "switches" in f and f["switches/t"].shape[0]:
            to_gba = f["switches/to_gba"][()] == 1
            first = float(f["switches/t"][()][to_gba][0]) if to_gba.any() else math.nan
    return ups, sps, first


def points(ks: list[int], modes: list[str], slows: list[float], on: list[str]) -> list[Point]:
    """Every point but K = 1 without a straggler (the baseline, run first)."""
    out = []
    for slow in [1.0, *slows]:
        for k in ks:
            for mode in ["-"] if k == 1 else modes:
                targets = ["-"] if slow == 1 else (["lead"] if k == 1 else on)
                out += [Point(k, mode, slow, who) for who in targets]
    return [p for p in out if not (p.k == 1 and p.slow == 1)]


def runnable(ks: list[int], cores: int | None) -> tuple[list[int], list[str]]:
    """The K that have a core per learner here, and a line for each one skipped."""
    cores = cores or 1
    keep = [k for k in ks if k <= cores]
    why = [
        f"K = {k} skipped: {cores} cores here (os.cpu_count()), K = {k} needs {k}, one per learner"
        for k in ks
        if k > cores
    ]
    return keep, why


def mean_t(x: list[float]) -> tuple[float, float]:
    """Mean and the half-width of its 95% t-interval (NaN with one value)."""
    a = np.asarray(x, "f8")
    if a.size < 2:
        return float(a.mean()), math.nan
    return float(a.mean()), float(stats.t.ppf(0.975, a.size - 1) * a.std(ddof=1) / a.size**0.5)


def ratio_t(num: list[float], den: list[float]) -> tuple[float, float, float]:
    """Geometric mean of the per-repeat ratios num / den and its 95% t-interval (on logs)."""
    d = np.log(np.asarray(num, "f8") / np.asarray(den, "f8"))
    est = math.exp(float(d.mean()))
    if d.size < 2:
        return est, math.nan, math.nan
    half = float(stats.t.ppf(0.975, d.size - 1) * d.std(ddof=1) / d.size**0.5)
    return est, math.exp(float(d.mean()) - half), math.exp(float(d.mean()) + half)


def _num(x: list[float], digits: int = 0) -> str:
    m, h = mean_t(x)
    return f"{m:,.{digits}f}" + ("" if math.isnan(h) else f" ± {h:,.{digits}f}")


def _ratio(r: Runs, base: Runs | None, key: str) -> str:
    if base is None or r.point.mode == "allreduce":
        return "-"
    est, lo, hi = ratio_t(getattr(r, key), getattr(base, key))
    return f"{est:.2f}" + ("" if math.isnan(lo) else f" [{lo:.2f}, {hi:.2f}]")


def table(rows: list[Runs], ms: dict[float, float]) -> str:
    """The markdown table of every point (``ms``: the straggler's sleep by slow-down)."""
    out = [
        "| K | sync | straggler | global updates/s (mean ± 95% t) | samples/s (mean ± 95% t) "
        "| updates/s / allreduce [95% t] | samples/s / allreduce [95% t] | parallel efficiency "
        "| first to GBA (s) | load (1 min) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    solo = next(r for r in rows if r.point.k == 1 and r.point.slow == 1)
    base_sps = float(np.mean(solo.samples))
    by = {r.point: r for r in rows}
    for r in rows:
        p = r.point
        base = by.get(Point(p.k, "allreduce", p.slow, p.on))
        eff = float(np.mean(r.samples)) / (p.k * base_sps)
        gba = [x for x in r.first_gba if math.isfinite(x)]
        went = f"{np.mean(gba):.1f}" if gba else "never"  # not nan: no run went GBA
        first = f"{went} ({len(gba)}/{len(r.first_gba)})" if p.mode == "switch" else "-"
        out.append(
            f"| {p.k} | {p.mode} | {p.label(ms.get(p.slow, 0.0))} | {_num(r.updates)} "
            f"| {_num(r.samples)} | {_ratio(r, base, 'updates')} | {_ratio(r, base, 'samples')} "
            f"| {eff:.2f} | {first} | {min(r.load):.2f}-{max(r.load):.2f} |"
        )
    return "\n".join(out)


def measure(a: argparse.Namespace, tmp: Path, p: Point, ms: float, into: Runs, i: int) -> None:
    """Run ``p`` once (repeat ``i``) and add its rates to ``into``."""
    d = tmp / f"k{p.k}-{p.mode}-{p.slow:g}-{p.on}-{i}"
    run(command(d, p, a.seconds, ms, a.actor_rate, a.seed + i), a.seconds)
    ups, sps, first = rates(d, p.k)
    into.updates.append(ups)
    into.samples.append(sps)
    into.first_gba.append(first)
    into.load.append(os.getloadavg()[0])
    print(
        f"  {p.k} {p.mode} {p.label(ms)} #{i}: {ups:,.0f} updates/s, {sps:,.0f} samples/s",
        file=sys.stderr,
    )


def bench(a: argparse.Namespace, tmp: Path) -> str:
    """Every point, ``a.repeats`` times: the baseline first, then the rest once per repeat."""
    ks, skipped = runnable(a.k, os.cpu_count())
    solo = Runs(Point(1, "-", 1.0, "-"))
    for i in range(a.repeats):
        measure(a, tmp, solo.point, 0.0, solo, i)
    t_update = 1.0 / float(np.mean(solo.updates))
    ms = {s: (s - 1) * t_update * 1000 for s in a.slow}
    rest = [Runs(p) for p in points(ks, a.modes, a.slow, a.on)]
    for i in range(a.repeats):
        for r in rest:
            measure(a, tmp, r.point, ms.get(r.point.slow, 0.0), r, i)
    head = [
        f"{os.cpu_count()} cores; load average before {a.load[0]:.2f}; {a.seconds:g} s per run, "
        f"{a.repeats} repeats per point; update time of K = 1: {t_update * 1000:.2f} ms",
        *skipped,
    ]
    return "\n".join(head) + "\n\n" + table([solo, *rest], ms)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--k", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    ap.add_argument("--slow", type=float, nargs="+", default=[2.0, 4.0], help="slow-downs (> 1)")
    ap.add_argument("--on", nargs="+", default=["lead", "other"], choices=("lead", "other"))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=5.0, help="each run's --max-seconds")
    ap.add_argument("--actor-rate", type=float, default=400.0, help="the actor's env steps/s")
    ap.add_argument("--seed", type=int, default=3, help="repeat i runs --seed SEED + i")
    ap.add_argument("--quick", action="store_true", help="a smoke run (K 1 2, allreduce and "
                    "gba, a 4x straggler on the lead, 2 repeats of 3 s)")  # fmt: skip
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    if a.quick:
        a.k, a.modes, a.slow, a.on = [1, 2], ["allreduce", "gba"], [4.0], ["lead"]
        a.repeats, a.seconds = 2, 3.0
    if 1 not in a.k or any(s <= 1 for s in a.slow) or a.repeats < 1:
        ap.error("--k must include 1 (the baseline), --slow values > 1, --repeats >= 1")
    return a


def main(argv: list[str] | None = None) -> None:
    a = parse(argv)
    a.load = os.getloadavg()
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="mpirl-group-") as tmp:
        text = bench(a, Path(tmp))
    took, after = time.monotonic() - t0, os.getloadavg()[0]
    text += f"\n\n({took:.0f} s in all; load average after {after:.2f})\n"
    print(text)
    if a.out:
        Path(a.out).write_text(text)


if __name__ == "__main__":
    main()
