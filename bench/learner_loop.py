"""The learner's loop in one process, against its own train step, alternating.

    python bench/learner_loop.py [--seconds 3] [--rounds 8] [--batch-size 64] [--steps]

`mpirl.roles.learner.Learner` (replay_at=buffer, evaluation off, no checkpoints) runs its real loop
-- receive, the checkpoint and stop checks, train, the PRIORITIES message back, its log rows, the
progress and link rows -- handed a scripted link (`mpirl.fakes.ScriptedLink`, the tests' fake)
that hands it a BATCH message (sampled from a prioritized memory and packed by `Wire.batch`, a
fresh copy each time, as `LinkEnd.receive` gives) whenever it polls; what it posts is counted and
dropped.  The reference is
`mpirl.agent.train_step.TrainStep` in a loop on the same batches (as `bench/overheads.py`'s
reference).  Both run in this process, one after the other, ``--rounds`` times; the table gives
updates per CPU second of each and their ratio per round, and the median.

No MPI and no other rank: this isolates the loop's own cost from the pipeline's (the MPI calls,
the other ranks' use of the shared caches) and from the shared machine's drift between
`bench/overheads.py`'s separate processes, so it can show a change of a few percent.  Pin it to
one core (``taskset -c 0``) with nothing else running.  ``--steps`` adds the wall time of each
loop step per update (each step wrapped in a timer, so the total is slightly inflated).
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse
import itertools
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

STEPS = (
    "receive",
    "checkpoint",
    "serve_group",
    "change_link",
    "train",
    "evaluate",
    "decide_stop",
    "send_stop",
    "report_rows",
    "wait",
)


def build(batch_size: int, tmp: Path):
    import torch

    from mpirl.agent import envs as envs_mod
    from mpirl.agent.qnet import param_count
    from mpirl.agent.train_step import TrainStep
    from mpirl.logs.runlog import RunLog
    from mpirl.replay.build import record_dtype
    from mpirl.run.config import Config
    from mpirl.transport.wire import Tag, Wire
    from mpirl.wiring import build_learner

    torch.set_num_threads(1)
    cfg = Config(
        batch_size=batch_size,
        eval_every=10**9,
        evaluator="inline",
        progress_seconds=1.0,
        checkpoint_seconds=0,
        target_return=None,
    )
    spec = envs_mod.inspect(cfg.env)
    wire = Wire(
        record_dtype(cfg, spec),
        param_count(spec.obs_shape, spec.n_actions, cfg.hidden, cfg.dueling),
    )
    from overheads import batch_messages  # bench/overheads.py, next to this file

    from mpirl.fakes import ScriptedLink, learner_ends, learner_topo

    bufs = batch_messages(cfg, spec, wire, 64)

    turns = itertools.count(1)
    ends = learner_ends(
        wire,
        {
            1: ScriptedLink(
                1,
                feed=lambda: [  # a fresh buffer, as Recv fills
                    (Tag.BATCH, bufs[next(turns) % len(bufs)].copy())
                ],
            )
        },
    )
    topo = learner_topo(1)
    log = RunLog(tmp / "learner.h5", {}, flush_seconds=2)
    lrn = build_learner(cfg, topo, spec, wire, log, ends, say=lambda s: None)
    lrn.start()
    step = TrainStep(cfg, spec)
    batches = [wire.unpack(b, Tag.BATCH, "bench").arrays for b in bufs]
    return lrn, step, batches, log


def loop_rate(lrn, seconds: float) -> float:
    """Updates per CPU second of `Learner.turn` (its loop without the ``serving`` test: the
    scripted buffers never stop)."""
    t_end, u0, c0 = time.monotonic() + seconds, lrn.updates, time.process_time()
    while time.monotonic() < t_end:
        lrn.turn()
    return (lrn.updates - u0) / (time.process_time() - c0)


def ref_rate(step, batches, seconds: float) -> float:
    t_end, k, c0 = time.monotonic() + seconds, 0, time.process_time()
    while time.monotonic() < t_end:
        arr = batches[k % len(batches)]
        step.step(arr["records"], arr["weights"])
        k += 1
    return k / (time.process_time() - c0)


def step_times(lrn, seconds: float) -> tuple[dict, float]:
    """Wall microseconds per update of each loop step (and of the train step inside `train`)."""
    acc: dict = defaultdict(float)

    def wrap(obj, name, key):
        f = getattr(obj, name)

        def timed(*a, **k):
            t0 = time.perf_counter()
            try:
                return f(*a, **k)
            finally:
                acc[key] += time.perf_counter() - t0

        setattr(obj, name, timed)
        return f

    originals = [(lrn, n, wrap(lrn, n, n)) for n in STEPS]
    originals.append(
        (lrn.trainer, "launch", wrap(lrn.trainer, "launch", "  train: TrainStep.launch"))
    )
    originals.append((lrn.trainer, "put", wrap(lrn.trainer, "put", "  train: TrainStep.put")))
    originals.append(
        (lrn.wire, "priorities", wrap(lrn.wire, "priorities", "  train: PRIORITIES pack"))
    )
    u0, t0 = lrn.updates, time.perf_counter()
    loop_rate(lrn, seconds)
    wall, n = time.perf_counter() - t0, lrn.updates - u0
    for obj, name, f in originals:
        setattr(obj, name, f)
    return {k: v / n * 1e6 for k, v in acc.items()}, wall / n * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=3.0, help="length of each measurement")
    ap.add_argument("--rounds", type=int, default=8, help="loop / reference pairs")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--steps", action="store_true", help="also time each loop step")
    ap.add_argument(
        "--dry-run",
        action="store_true",
        help="two rounds of 0.2 s: checks the bench runs (the suite uses it)",
    )
    a = ap.parse_args()
    if a.dry_run:
        a.seconds, a.rounds = 0.2, 2
    for flag, v, lo in (
        ("--seconds", a.seconds, 0.01),
        ("--rounds", a.rounds, 1),
        ("--batch-size", a.batch_size, 1),
    ):
        if not v >= lo:
            ap.error(f"{flag} {v}: give a value >= {lo}")
    from overheads import BENCH_MEMORY

    if a.batch_size > BENCH_MEMORY:
        ap.error(
            f"--batch-size {a.batch_size}: give a batch size up to {BENCH_MEMORY} (the "
            "transitions the bench samples its batches from)"
        )
    load0 = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        lrn, step, batches, log = build(a.batch_size, Path(tmp))
        loop_rate(lrn, min(1.0, a.seconds))  # warm up both
        ref_rate(step, batches, min(1.0, a.seconds))
        rows = []
        for i in range(a.rounds):
            got = loop_rate(lrn, a.seconds)
            ref = ref_rate(step, batches, a.seconds)
            rows.append((got, ref, got / ref))
            print(
                f"round {i}: loop {got:,.0f}/CPU s, TrainStep {ref:,.0f}/CPU s, "
                f"ratio {got / ref:.3f}",
                file=sys.stderr,
                flush=True,
            )
        steps = step_times(lrn, a.seconds) if a.steps else None
        log.close()
    load1 = os.getloadavg()
    ratios = [r for _, _, r in rows]
    print("| round | learner loop, updates per CPU s | TrainStep, updates per CPU s | ratio |")
    print("|---|---|---|---|")
    for i, (got, ref, r) in enumerate(rows):
        print(f"| {i} | {got:,.0f} | {ref:,.0f} | {r:.3f} |")
    print(
        f"| median | {statistics.median(g for g, _, _ in rows):,.0f} | "
        f"{statistics.median(f for _, f, _ in rows):,.0f} | "
        f"**{statistics.median(ratios):.3f}** |"
    )
    if steps is not None:
        per, total = steps
        print("\n| loop step | us per update |\n|---|---|")
        for k, v in sorted(per.items(), key=lambda kv: (kv[0].startswith(" "), -kv[1])):
            print(f"| {k} | {v:.1f} |")
        print(f"| whole turn | {total:.1f} |")
    print(
        f"\nbatch {a.batch_size}, {a.rounds} rounds of {a.seconds:g} s per side; load average "
        f"{load0[0]:.2f} at start, {load1[0]:.2f} at the end"
    )


if __name__ == "__main__":
    main()
