"""Where the greedy evaluation should run: learner updates/s with evaluations inline, in a thread
and in a child process, against no evaluation at all, in one invocation.

    python bench/evaluation.py [--seconds 10] [--rounds 2] [--eval-every 500] [--out FILE.md]

One process runs the learner's own ``TrainStep`` (CartPole-v1, the default MLP and batch, one
torch thread) in a loop on prepared batches and asks an ``mpirl.roles.evaluation`` runner for a
greedy evaluation every ``--eval-every`` updates, exactly as the learner loop does (one in flight;
polled once per update).  The weights evaluated are a hand-set MLP that balances the pole (a linear
controller written into the first layers), so every evaluation plays 10 full 500-step episodes:
the cost of the evaluations near the target, where they matter for time to target.  Modes run
interleaved, ``--rounds`` times each; the table gives the median updates/s, the median over rounds
of its ratio to the no-evaluation reference of the same round (the load of a shared machine drifts
between rounds), the evaluations finished and their mean wall time.

Run it on an otherwise idle machine and then with the pipeline's other ranks competing (e.g. under
``mpirun -n 9`` load), since on 2 cores the answer depends on whether a core is free.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse
import statistics
import time
from pathlib import Path

import numpy as np

if TYPE_CHECKING:
    from mpirl.run.config import Config

MODES = ("none", "inline", "thread", "process")


def balancing_params(hidden: tuple[int, ...], n_actions: int = 2) -> np.ndarray:
    """Flat MLP weights whose greedy policy is ``a = [0.1 x + 0.5 x' + 3 th + th' > 0]``
    (500 steps in every CartPole-v1 episode): hidden0 = relu(+-w.s), later hidden layers pass
    those two units through, q1 = unit0 - unit1, q0 = 0."""
    from mpirl.agent.qnet import layer_shapes

    w = np.array([0.1, 0.5, 3.0, 1.0], np.float32)
    out = []
    for i, (name, o, inp) in enumerate(layer_shapes(4, n_actions, hidden, False)):
        W = np.zeros((o, inp), np.float32)
        if i == 0:
            W[0], W[1] = w, -w
        elif name.startswith("hidden"):
            W[0, 0] = W[1, 1] = 1.0
        else:  # q head
            W[1, 0], W[1, 1] = 1.0, -1.0
        out += [W.ravel(), np.zeros(o, np.float32)]
    return np.concatenate(out)


def batches(cfg: Config, spec, n: int = 32):
    from mpirl.replay.build import record_dtype

    rng = np.random.default_rng(0)
    out = []
    for _ in range(n):
        rec = np.zeros(cfg.batch_size, record_dtype(cfg, spec))
        rec["obs"] = rng.normal(0, 0.5, rec["obs"].shape)
        rec["next_obs"] = rec["obs"] + rng.normal(0, 0.05, rec["obs"].shape)
        rec["action"] = rng.integers(0, spec.n_actions, cfg.batch_size)
        rec["reward"] = 1.0
        rec["discount"] = cfg.gamma**cfg.n_step
        out.append((rec, np.ones(cfg.batch_size, np.float32)))
    return out


def one(mode: str, seconds: float, eval_every: int, cfg: Config, spec, data) -> dict:
    import torch

    from mpirl.agent.train_step import TrainStep
    from mpirl.roles.evaluation import make_runner

    torch.set_num_threads(1)
    step = TrainStep(cfg, spec)
    flat = balancing_params(cfg.hidden)
    runner = make_runner(mode, cfg, spec) if mode != "none" else None
    if runner is not None:  # start-up (the child's imports) is not what is compared
        runner.request(flat, 0, 0, 0)
        while runner.poll() is None:
            time.sleep(0.01)
    updates, last, rnd, evals, eval_s = 0, 0, 1, 0, []
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        rec, w = data[updates % len(data)]
        step.step(rec, w)
        updates += 1
        if runner is None:
            continue
        if updates - last >= eval_every and not runner.busy:
            last = updates
            runner.request(flat, rnd, updates, 0)
            rnd += 1
        res = runner.poll()
        if res is not None:
            evals += 1
            eval_s.append(res.eval_s)
            assert res.returns.mean() == 500.0, res.returns
    wall = time.monotonic() - t0
    if runner is not None:
        runner.close()
    return {
        "mode": mode,
        "rate": updates / wall,
        "evals": evals,
        "eval_s": float(np.mean(eval_s)) if eval_s else float("nan"),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--eval-every", type=int, default=500)
    ap.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    from mpirl.agent.envs import inspect
    from mpirl.run.config import Config

    cfg = Config()
    spec = inspect(cfg.env)
    data = batches(cfg, spec)
    rows: dict[str, list[dict]] = {m: [] for m in a.modes}
    for _ in range(a.rounds):
        for m in a.modes:
            r = one(m, a.seconds, a.eval_every, cfg, spec, data)
            rows[m].append(r)
            print(r, flush=True)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    lines = [
        (
            f"{cores} CPU cores, load average {os.getloadavg()[0]:.1f}, {a.seconds:g} s x "
            f"{a.rounds} per mode, an evaluation (10 x 500 steps) every {a.eval_every} "
            "updates"
        ),
        "",
        "| evaluator | updates/s (median) | x no evaluation (median per round) | evaluations "
        "| eval wall s (mean) |",
        "|---|---|---|---|---|",
    ]
    for m, rs in rows.items():
        rate = statistics.median(r["rate"] for r in rs)
        ev = sum(r["evals"] for r in rs)
        es = np.nanmean([r["eval_s"] for r in rs]) if m != "none" else float("nan")
        # each round's ratio to the reference of the same round (load drifts between rounds)
        ratio = (
            statistics.median(r["rate"] / n["rate"] for r, n in zip(rs, rows["none"], strict=True))
            if "none" in rows
            else float("nan")
        )
        lines.append(
            f"| {m} | {rate:,.0f} | {ratio:.2f} | {ev} | {'-' if m == 'none' else f'{es:.2f}'} |"
        )
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        Path(a.out).write_text(text)


if __name__ == "__main__":
    main()
