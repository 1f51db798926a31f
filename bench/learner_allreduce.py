"""The learner group's allreduce on its own: K learner ranks, each pinned to a core of its own,
training `TrainStep` on scripted batches, against one learner; the cost of the sync itself.

    python bench/learner_allreduce.py [--k 2] [--seconds 1] [--rounds 10] [--batch-size 64]
        [--straggle-ms MS] [--wait none polled adaptive spin blocking adaptive:CAP_US:BURST_US
        adaptive@mpi ...]

One job, ``mpirun -n K python bench/learner_allreduce.py _rank ...``: rank r pins itself to
core r (``os.sched_setaffinity``, as ``taskset -c``), one torch thread, and trains
`mpirl.agent.train_step.TrainStep` (CartPole-v1's MLP, the default configuration) on pre-made
random CartPole-shaped batches (64 per rank, seeded by rank, used in turn): no actors, no
buffer, no replay memory, no learner role (as `bench/learner_loop.py` isolates the loop).  The
sync is the real one, ``mpirl.transport.group.make_sync('allreduce', comm, ...)`` (its sum
through the node's shared memory, `mpirl.transport.node_sum`; a wait named ``...@mpi``: the
same sync with MPI's persistent all-reduce instead, ``shared=False``), its ``wait``
(how the Iallreduce's request is completed) set per window by ``--wait``: ``adaptive`` is the
default (`mpirl.transport.waiting.SpinThenNap`), ``adaptive:CAP_US:BURST_US`` the same with
another spin cap and burst, ``polled`` the former naps-only `group.wait_polled`, ``spin`` polls
``Test`` without ever sleeping, ``blocking`` calls ``Wait`` (MPICH spins inside it); ``none``
trains the K ranks independently, without a sync: the machine's own ceiling for K busy cores
(shared caches, other jobs), not a learner group.  The reference, K = 1, is rank 0 training
alone without a sync while the other ranks nap on a barrier.  ``--straggle-ms MS`` makes the
last learner sleep MS in every update (as ``--straggle``) outside the K = 1 windows.

Each round runs every variant for ``--seconds`` (K = 1 first), so drift on the shared machine
hits them alike.  Reported: global updates/s, global samples/s (K x batch per update),
parallel efficiency = samples/s / (K x samples/s of K = 1 in the same round), median and
min..max over the rounds; CPU ms per update of each rank (spinning shows there) and the
sync's wait per update (mean, and p90 in brackets), medians over the rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")  # before torch is imported (in the ranks)

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

WAITS = ("adaptive", "polled", "spin", "blocking", "none")
CHECK_EVERY = 50  # updates between the ranks' agreement on whether to stop


def batches(spec: Any, batch: int, rank: int, count: int = 64) -> list[tuple[Any, Any]]:
    """Random CartPole-shaped transitions and importance weights (seeded by rank)."""
    import numpy as np

    from mpirl.transport.wire import transition_dtype

    rng = np.random.default_rng(rank)
    out = []
    for _ in range(count):
        rec = np.zeros(batch, transition_dtype(spec.obs_shape, np.float32))
        rec["obs"] = rng.normal(0, 0.5, rec["obs"].shape)
        rec["next_obs"] = rec["obs"] + rng.normal(0, 0.05, rec["obs"].shape)
        rec["action"] = rng.integers(0, spec.n_actions, batch)
        rec["reward"] = 1.0
        rec["discount"] = 0.99 * (rng.random(batch) > 0.05)
        out.append((rec, rng.uniform(0.2, 1.0, batch).astype(np.float32)))
    return out


def pinned_learner(rank: int, batch: int) -> tuple[Any, Any]:
    """This rank pinned to core ``rank`` (mod the usable ones), one torch thread, and its
    `TrainStep` (the default configuration at ``batch``): (env spec, train step)."""
    import dataclasses

    import torch

    from mpirl.agent import envs
    from mpirl.agent.train_step import TrainStep
    from mpirl.run.config import Config

    cpus = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpus[rank % len(cpus)]})
    torch.set_num_threads(1)
    cfg = dataclasses.replace(Config(), batch_size=batch)
    spec = envs.inspect(cfg.env)
    return spec, TrainStep(cfg, spec)


def waiter(name: str) -> Any:
    """The request-completing callable for ``--wait`` (req -> seconds waited)."""
    from mpirl.transport.group import wait_polled
    from mpirl.transport.waiting import SpinThenNap

    def spin(req: Any) -> float:
        t0 = time.monotonic()
        while not req.Test():
            pass
        return time.monotonic() - t0

    def blocking(req: Any) -> float:
        t0 = time.monotonic()
        req.Wait()
        return time.monotonic() - t0

    if name.startswith("adaptive:"):  # adaptive:CAP_US:BURST_US, for trying settings
        cap, burst = (float(x) * 1e-6 for x in name.split(":")[1:])
        return SpinThenNap(spin_cap=cap, burst=burst).wait
    return {
        "adaptive": SpinThenNap().wait,
        "polled": wait_polled,
        "spin": spin,
        "blocking": blocking,
    }[name]


def rank_main(
    seconds: float, rounds: int, batch: int, straggle_ms: float, waits: list[str]
) -> None:
    """One learner rank of the job: pin, then ``rounds`` times each variant (K = 1 first) for
    ``seconds``; rank 0 prints one JSON line per window."""

    import numpy as np
    from mpi4py import MPI

    from mpirl.transport.group import (
        AllreduceSync,
        LocalSync,
        bcast_weights,
        make_sync,
        wait_polled,
    )

    comm = MPI.COMM_WORLD
    rank, k = comm.Get_rank(), comm.Get_size()
    spec, step = pinned_learner(rank, batch)
    n_params = sum(p.numel() for p in step.params)
    node = make_sync("allreduce", comm, n_params, step.device, batch=batch)
    assert isinstance(node, AllreduceSync)
    syncs = {"node": node}
    if any(w.endswith("@mpi") for w in waits):  # (collective: every rank makes it)
        syncs["mpi"] = AllreduceSync(comm, n_params, batch=batch, shared=False)
    for s in syncs.values():
        if rank == k - 1:  # the straggler: the last learner, as bench/learner_group.py's
            s.straggle_s = straggle_ms / 1e3
    alone_sync = LocalSync(node.straggle_s)  # "none": the same sleep, no group
    waiters = {w: waiter(w.removesuffix("@mpi")) for w in waits if w != "none"}
    data = batches(spec, batch, rank)
    flag = np.zeros(1, np.int32)

    def window(variant: str, t_end: float) -> dict:
        """Update until every rank is past ``t_end`` (agreed every CHECK_EVERY updates, so all
        make the same number).  K = 1: rank 0 alone, the others nap on a barrier."""
        alone = variant == "K=1"
        sync = syncs["mpi" if variant.endswith("@mpi") else "node"]
        if alone and rank > 0:
            wait_polled(comm.Ibarrier())
            return {}
        step.sync = None if alone else alone_sync if variant == "none" else sync
        if step.sync is not sync and step.opt.grad_buffer is not None:
            # a lone learner's gradients as its own (backward hands each .grad a new tensor),
            # not the views an all-reduce window bound into its buffer (bound again there)
            step.opt.grad_buffer = None
            for p in step.params:
                p.grad = None
        if step.sync is sync:
            sync.wait = waiters[variant]
            bcast_weights(comm, step)  # the same network again (the K = 1 window moved rank 0's)
        spinner = getattr(sync.wait, "__self__", None)
        spun0 = getattr(spinner, "spun_s", 0.0)
        waited: list[float] = []
        n, t0, c0 = 0, time.monotonic(), time.process_time()
        while True:
            rec, w = data[n % len(data)]
            step.step(rec, w)
            waited.append(sync.wait_s if step.sync is sync else 0.0)
            n += 1
            if n % CHECK_EVERY == 0:
                flag[0] = time.monotonic() >= t_end
                if not alone:  # napping, so a rank ahead does not spin here
                    wait_polled(comm.Iallreduce(MPI.IN_PLACE, [flag, MPI.INT], op=MPI.MIN))
                if flag[0]:
                    break
        wall, cpu = time.monotonic() - t0, time.process_time() - c0
        if alone:
            wait_polled(comm.Ibarrier())
        return {
            "n": n,
            "wall": wall,
            "cpu_ms": cpu / n * 1e3,
            "wait_ms": float(np.mean(waited)) * 1e3,
            "wait_p90_ms": float(np.percentile(waited, 90)) * 1e3,
            "spun_ms": (getattr(spinner, "spun_s", 0.0) - spun0) / n * 1e3,
        }

    variants = ["K=1", *waits]
    for v in variants:  # warm up each
        window(v, time.monotonic() + min(0.5, seconds))
    for r in range(rounds):
        for v in variants:
            comm.Barrier()
            got = window(v, time.monotonic() + seconds)
            rows = comm.gather(got)
            if rank == 0:
                assert rows is not None
                emit(r, v, 1 if v == "K=1" else k, batch, rows)


def emit(round_: int, variant: str, k: int, batch: int, rows: list[dict]) -> None:
    """One window's JSON line (rank 0; ``rows``: every rank's window, the first k trained)."""
    got, rows = rows[0], rows[:k]
    line = {
        "round": round_,
        "variant": variant,
        "k": k,
        "updates_per_s": got["n"] / got["wall"],
        "samples_per_s": k * batch * got["n"] / got["wall"],
        "cpu_ms": [x["cpu_ms"] for x in rows],
        "wait_ms": statistics.mean(x["wait_ms"] for x in rows),
        "wait_p90_ms": max(x["wait_p90_ms"] for x in rows),
        "spun_ms": statistics.mean(x["spun_ms"] for x in rows),
    }
    print(json.dumps(line), flush=True)


def spread(xs: list[float], fmt: str) -> str:
    return f"{statistics.median(xs):{fmt}} ({min(xs):{fmt}}..{max(xs):{fmt}})"


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "_rank":
        a = sys.argv
        rank_main(float(a[2]), int(a[3]), int(a[4]), float(a[5]), a[6:])
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--k", type=int, default=2, help="learner ranks")
    ap.add_argument("--seconds", type=float, default=1.0, help="length of each window")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument(
        "--straggle-ms",
        type=float,
        default=0.0,
        help="the last learner sleeps this long in every update (not in the K = 1 windows)",
    )
    ap.add_argument("--wait", nargs="+", default=["none", "polled", "adaptive"], help=f"of {WAITS}")
    a = ap.parse_args()
    ncpu = len(os.sched_getaffinity(0))
    if not 2 <= a.k <= ncpu:
        ap.error(f"--k {a.k}: give 2..{ncpu} (this machine's cores, one per learner)")
    for w in a.wait:
        plain = w.removesuffix("@mpi") if w != "none" else w
        if plain not in WAITS and not plain.startswith("adaptive:"):
            ap.error(f"--wait {w}: one of {WAITS} or adaptive:CAP_US:BURST_US, each but none")
    from mpirl.launch import mpirun_cmd

    cmd = [*mpirun_cmd(a.k), sys.executable, str(Path(__file__).resolve()), "_rank"]
    cmd += [str(a.seconds), str(a.rounds), str(a.batch_size), str(a.straggle_ms), *a.wait]
    load0, t0 = os.getloadavg(), time.monotonic()
    budget = (a.rounds + 1) * (len(a.wait) + 1) * (a.seconds + 1) + 120
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, cwd=ROOT)
    assert p.stdout is not None
    rows = []
    for line in p.stdout:
        rows.append(json.loads(line))
        r = rows[-1]
        print(
            f"round {r['round']} {r['variant']}: {r['updates_per_s']:,.0f} updates/s, CPU ms per "
            f"update {[round(c, 2) for c in r['cpu_ms']]}, wait {r['wait_ms']:.2f} ms "
            f"(p90 {r['wait_p90_ms']:.2f}), spun {r['spun_ms']:.2f} ms",
            file=sys.stderr,
            flush=True,
        )
    if p.wait(timeout=budget):
        sys.exit(f"{' '.join(cmd)} failed ({p.returncode})")
    load1 = os.getloadavg()
    base = {r["round"]: r["samples_per_s"] for r in rows if r["variant"] == "K=1"}
    print(
        "| learners | sync wait | global updates/s | global samples/s | parallel efficiency | "
        "CPU ms per update (per rank) | sync wait ms per update (p90) |"
    )
    print("|---|---|---|---|---|---|---|")
    for v in ["K=1", *a.wait]:
        rs = [r for r in rows if r["variant"] == v]
        k = rs[0]["k"]
        eff = [r["samples_per_s"] / (k * base[r["round"]]) for r in rs]
        cpu = [statistics.median(r["cpu_ms"][i] for r in rs) for i in range(k)]
        name = "- (one learner)" if v == "K=1" else ("none (independent)" if v == "none" else v)
        bold = "**" if k > 1 and v != "none" else ""
        print(
            f"| {k} | {name} | {spread([r['updates_per_s'] for r in rs], ',.0f')} | "
            f"{spread([r['samples_per_s'] for r in rs], ',.0f')} | "
            f"{bold}{spread(eff, '.2f')}{bold} | "
            f"{' / '.join(f'{c:.2f}' for c in cpu)} | "
            f"{statistics.median(r['wait_ms'] for r in rs):.2f} "
            f"({statistics.median(r['wait_p90_ms'] for r in rs):.2f}) |"
        )
    print(
        f"\n{ncpu} cores, learner rank r pinned to core r; batch {a.batch_size} per learner; "
        f"{f'the last learner sleeps {a.straggle_ms:g} ms per update; ' if a.straggle_ms else ''}"
        f"{a.rounds} rounds of {a.seconds:g} s windows, the variants in turn in one job; "
        f"parallel efficiency = samples/s / (K x samples/s of K = 1 in the same round), median "
        f"(min..max) over rounds; load average (1 min) {load0[0]:.2f} before, {load1[0]:.2f} "
        f"after ({time.monotonic() - t0:.0f} s in all)"
    )


if __name__ == "__main__":
    main()
