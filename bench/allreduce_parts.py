"""Where a learner group's update spends its time: one `TrainStep` update cut into its sections,
timed with ``perf_counter_ns`` on K pinned learner ranks, for one learner alone, K learners
training independently (no sync) and K learners with the real `AllreduceSync` (its sum through
the node's shared memory, or MPI's persistent all-reduce).

    python bench/allreduce_parts.py [--k 2] [--updates 4000] [--batch-size 64]
        [--modes alone none node mpi] [--repeat 2]

One ``mpirun -n K`` job (`bench/learner_allreduce.py`'s set-up: rank r pinned to core r, one
torch thread, scripted random CartPole batches).  An update is ``TrainStep.launch``'s sequence
with a clock between its steps: ``put`` (the batch as tensors), ``loss`` (the double-DQN
forward), ``zero`` (Adam's zero_grad), ``backward``, then either ``apply`` alone (clip and Adam,
no sync) or the sync's ``step`` split into ``wait`` (its ``wait_s``: completing the sum),
``apply`` (the ``apply_step`` it calls, timed by wrapping it) and ``sync`` (the rest of it:
binding, weights, starting the sum), and ``back`` (loss and |td| out).  Prints per mode and
rank the mean microseconds of each section, their sum, and the wall and CPU microseconds per
update; the modes run in turn ``--repeat`` times in one job, after a warm-up of 300 updates.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")  # before torch is imported (in the ranks)

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

MODES = ("alone", "none", "node", "mpi")
SECTIONS = ("put", "loss", "zero", "backward", "sync", "wait", "apply", "back")


def rank_main(updates: int, batch: int, modes: list[str]) -> None:

    import numpy as np
    from mpi4py import MPI

    from bench.learner_allreduce import batches, pinned_learner
    from mpirl.transport.group import AllreduceSync, bcast_weights, wait_polled

    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    spec, step = pinned_learner(rank, batch)
    n_params = sum(p.numel() for p in step.params)
    syncs = {  # collective, made in the same order on every rank
        kind: AllreduceSync(comm, n_params, batch=batch, shared=kind == "node")
        for kind in ("node", "mpi")
        if kind in modes
    }
    data = batches(spec, batch, rank)
    ns = time.perf_counter_ns
    applied = [0]
    apply_step = step.apply_step

    def timed_apply(scale: float = 1.0) -> None:
        t0 = ns()
        apply_step(scale)
        applied[0] = ns() - t0

    step.apply_step = timed_apply  # type: ignore[method-assign]

    def update(i: int, t: np.ndarray) -> None:
        rec, w = data[i % len(data)]
        a = ns()
        batch_ = step.put(rec, w)
        b = ns()
        loss, td = step._loss(batch_)
        c = ns()
        step.opt.zero_grad()
        d = ns()
        loss.backward()
        e = ns()
        sync = step.sync
        if sync is None:
            step.apply_step()
            waited = 0
        else:
            sync.step(step, loss, td)
            waited = int(sync.wait_s * 1e9)
        f = ns()
        step._back(loss.detach(), td).result()
        g = ns()
        t += (b - a, c - b, d - c, e - d, f - e - waited - applied[0], waited, applied[0], g - f)

    def run(mode: str) -> None:
        if mode == "alone" and rank > 0:
            wait_polled(comm.Ibarrier())
            comm.gather(None)
            return
        sync = syncs.get(mode)
        step.sync = sync
        if sync is None and step.opt.grad_buffer is not None:
            step.opt.grad_buffer = None  # a lone learner's own gradients (learner_allreduce.py)
            for p in step.params:
                p.grad = None
        if sync is not None:
            bcast_weights(comm, step)
        t = np.zeros(len(SECTIONS), np.int64)
        for i in range(300):
            update(i, np.zeros(len(SECTIONS), np.int64))
        c0, w0 = time.process_time(), time.perf_counter()
        for i in range(updates):
            update(i, t)
        cpu, wall = time.process_time() - c0, time.perf_counter() - w0
        if mode == "alone":
            wait_polled(comm.Ibarrier())
        rows = comm.gather((t / updates / 1e3, cpu / updates * 1e6, wall / updates * 1e6))
        if rank == 0:
            assert rows is not None
            for r, (us, c, wl) in enumerate(rows[:1] if mode == "alone" else rows):
                parts = " | ".join(f"{x:.1f}" for x in us)
                print(f"| {mode} | {r} | {parts} | {us.sum():.1f} | {wl:.1f} | {c:.1f} |")
            sys.stdout.flush()

    for m in modes:
        comm.Barrier()
        run(m)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "_rank":
        rank_main(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:])
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--k", type=int, default=2, help="learner ranks")
    ap.add_argument("--updates", type=int, default=4000, help="timed updates per mode")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    ap.add_argument("--repeat", type=int, default=2, help="times the modes run in turn")
    a = ap.parse_args()
    ncpu = len(os.sched_getaffinity(0))
    if not 2 <= a.k <= ncpu:
        ap.error(f"--k {a.k}: give 2..{ncpu} (this machine's cores, one per learner)")
    import subprocess

    from mpirl.launch import mpirun_cmd

    cmd = [*mpirun_cmd(a.k), sys.executable, str(Path(__file__).resolve()), "_rank"]
    cmd += [str(a.updates), str(a.batch_size), *(a.modes * a.repeat)]
    load0 = os.getloadavg()
    print(f"| mode | rank | {' | '.join(SECTIONS)} | sum | wall | CPU |")
    print("|---|---|" + "---|" * (len(SECTIONS) + 3), flush=True)
    subprocess.run(cmd, check=True, cwd=ROOT, timeout=600)
    print(
        f"\nmicroseconds per update (means over {a.updates:,} updates after 300 of warm-up); "
        f"batch {a.batch_size} per learner, {a.k} learners pinned to a core each; load average "
        f"(1 min) {load0[0]:.2f} before, {os.getloadavg()[0]:.2f} after"
    )


if __name__ == "__main__":
    main()
