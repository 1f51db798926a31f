#!/usr/bin/env python
"""Prioritized replay throughput: mpirl vs cpprb vs TorchRL, in one process.

    python bench/replay.py [--repeats 5] [--capacity 1048576] [--atari-capacity 32768]

Every library gets the same work in its own native data format, built before timing:

* memory filled to capacity first (untimed), alpha 0.6, beta 0.4;
* add: chunks of 64 transitions with their priorities, on the full memory (overwrites), in
  transitions/s; work a library defers (mpirl's tree propagation) is flushed inside the timing;
* sample: batch 512 with importance weights, in transitions/s; each library returns what a learner
  needs: indices, weights and the transitions (a copy);
* update: 512 priorities at sampled indices, in priorities/s;
* learner step: sample 512 + update 512, in steps/s;
* Atari-shaped rows (obs and next_obs uint8[4,84,84], smaller capacity): add and sample.

Each measurement runs an operation in a loop for ``--seconds``; libraries are interleaved within a
repeat so that a noisy machine hurts them alike; the table gives the median over
``--repeats`` and ratios to cpprb. A competitor that fails to import is a "not installed" row.
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

ALPHA, BETA, EPS = 0.6, 0.4, 1e-6


def shape_spec(kind: str) -> dict:
    obs = ((4,), np.float32) if kind == "cartpole" else ((4, 84, 84), np.uint8)
    return {
        "obs": obs,
        "action": ((), np.int64),
        "reward": ((), np.float32),
        "next_obs": obs,
        "done": ((), np.bool_),
    }


def random_columns(spec: dict, n: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    cols = {}
    for name, (shape, dt) in spec.items():
        if dt == np.uint8:
            cols[name] = rng.integers(0, 256, (n, *shape), dtype=np.uint8)
        elif dt == np.bool_:
            cols[name] = rng.random(n) < 0.05
        elif dt == np.int64:
            cols[name] = rng.integers(0, 2, n)
        else:
            cols[name] = rng.standard_normal((n, *shape)).astype(dt)
    return cols


# ------------------------------------------------------------------------------------ adapters
class Mpirl:
    name = "mpirl"

    def __init__(self, capacity: int, spec: dict):
        from mpirl.replay import PrioritizedReplay

        self.dtype = np.dtype([(k, dt, shape) for k, (shape, dt) in spec.items()])
        self.m = PrioritizedReplay(capacity, self.dtype, alpha=ALPHA, beta=BETA, eps=EPS, seed=0)

    def chunk(self, cols, td):
        rec = np.empty(len(td), self.dtype)
        for k, v in cols.items():
            rec[k] = v
        return rec, td

    def add(self, c):
        self.m.add(*c)

    def sync(self):
        self.m.total_priority()  # flushes deferred propagation

    def sample(self, b):
        return self.m.sample(b)  # indices, generations, weights, priorities, records

    @staticmethod
    def check(s, b):
        assert s.indices.shape == (b,) and s.weights.shape == (b,) and len(s.records) == b

    def update_args(self, s):
        return s.indices, s.generations

    def update(self, key, td):
        self.m.update(key[0], key[1], td)

    def step(self, b, td):
        s = self.m.sample(b)
        self.m.update(s.indices, s.generations, td)


class Cpprb:
    name = "cpprb"

    def __init__(self, capacity: int, spec: dict):
        from cpprb import PrioritizedReplayBuffer

        env = {k: {"shape": shape if shape else 1, "dtype": dt} for k, (shape, dt) in spec.items()}
        self.rb = PrioritizedReplayBuffer(capacity, env, alpha=ALPHA, eps=EPS)

    def chunk(self, cols, td):
        return {k: np.ascontiguousarray(v) for k, v in cols.items()}, td

    def add(self, c):
        self.rb.add(**c[0], priorities=c[1])

    def sync(self):
        pass

    def sample(self, b):
        return self.rb.sample(b, beta=BETA)  # dict: columns + weights + indexes

    @staticmethod
    def check(s, b):
        assert s["indexes"].shape[0] == b and s["weights"].shape[0] == b and len(s["obs"]) == b

    def update_args(self, s):
        return s["indexes"]

    def update(self, key, td):
        self.rb.update_priorities(key, td)

    def step(self, b, td):
        s = self.rb.sample(b, beta=BETA)
        self.rb.update_priorities(s["indexes"], td)


class TorchRLPlain:
    """PrioritizedReplayBuffer + LazyTensorStorage: the faster TorchRL configuration here."""

    name = "TorchRL PRB"

    def __init__(self, capacity: int, spec: dict):
        import logging

        import torch
        from torchrl.data import LazyTensorStorage, PrioritizedReplayBuffer

        logging.getLogger("torchrl").setLevel(logging.WARNING)
        self.torch = torch
        self.rb = PrioritizedReplayBuffer(
            alpha=ALPHA, beta=BETA, eps=EPS, storage=LazyTensorStorage(capacity)
        )

    def chunk(self, cols, td):
        from tensordict import TensorDict

        n = len(td)
        return (
            TensorDict(
                {k: self.torch.from_numpy(np.ascontiguousarray(v)) for k, v in cols.items()},
                batch_size=[n],
            ),
            self.torch.from_numpy(td.astype(np.float32)),
        )

    def add(self, c):
        idx = self.rb.extend(c[0])
        self.rb.update_priority(idx, c[1])  # extend alone enters new data at max priority

    def sync(self):
        pass

    def sample(self, b):
        return self.rb.sample(b, return_info=True)  # (TensorDict, {"index", "priority_weight"})

    @staticmethod
    def check(s, b):
        data, info = s
        assert len(info["index"]) == b and len(info["priority_weight"]) == b and len(data) == b

    def update_args(self, s):
        return s[1]["index"]

    def update(self, key, td):
        self.rb.update_priority(key, td)

    def step(self, b, td):
        _, info = self.rb.sample(b, return_info=True)
        self.rb.update_priority(info["index"], td)


class TorchRLTD(TorchRLPlain):
    """TensorDictPrioritizedReplayBuffer: priorities read from the data's "td_error" on extend."""

    name = "TorchRL TDPRB"

    def __init__(self, capacity: int, spec: dict):
        import logging

        import torch
        from torchrl.data import LazyTensorStorage, TensorDictPrioritizedReplayBuffer

        logging.getLogger("torchrl").setLevel(logging.WARNING)
        self.torch = torch
        self.rb = TensorDictPrioritizedReplayBuffer(
            alpha=ALPHA,
            beta=BETA,
            eps=EPS,
            storage=LazyTensorStorage(capacity),
            priority_key="td_error",
        )

    def chunk(self, cols, td):
        data, tdt = super().chunk(cols, td)
        data["td_error"] = tdt
        return data, tdt

    def add(self, c):
        self.rb.extend(c[0])

    def sample(self, b):
        return self.rb.sample(b)  # TensorDict with "index" and "priority_weight"

    @staticmethod
    def check(s, b):
        assert len(s["index"]) == b and len(s["priority_weight"]) == b and len(s["obs"]) == b

    def update_args(self, s):
        return s["index"]

    def step(self, b, td):
        s = self.rb.sample(b)
        self.rb.update_priority(s["index"], td)


ADAPTERS = {"mpirl": Mpirl, "cpprb": Cpprb, "torchrl": TorchRLPlain, "torchrl-td": TorchRLTD}


# ------------------------------------------------------------------------------------- timing
def timed(fn, per_call: float, seconds: float, after=None) -> float:
    """Rate (units/s) of calling ``fn`` in a loop for about ``seconds`` (at least 3 calls)."""
    n = 0
    t0 = time.perf_counter()
    while True:
        fn()
        n += 1
        if n >= 3 and time.perf_counter() - t0 >= seconds:
            break
    if after is not None:
        after()
    return n * per_call / (time.perf_counter() - t0)


class Bench:
    def __init__(self, lib_cls, capacity: int, spec: dict, args, rng: np.random.Generator):
        self.lib = lib_cls(capacity, spec)
        self.name = lib_cls.name
        self.args = args
        itemsize = sum(int(np.prod(shape)) * np.dtype(dt).itemsize for shape, dt in spec.values())
        fill = max(args.chunk, min(capacity, args.fill_chunk, (64 << 20) // itemsize))
        cols = random_columns(spec, fill, rng)
        big = self.lib.chunk(cols, rng.exponential(1.0, fill))
        for _ in range(-(-capacity // fill)):
            self.lib.add(big)
        self.lib.sync()
        self.chunks = [
            self.lib.chunk(random_columns(spec, args.chunk, rng), rng.exponential(1.0, args.chunk))
            for _ in range(8)
        ]
        s = self.lib.sample(args.batch)
        self.lib.check(s, args.batch)
        self.keys = [self.lib.update_args(self.lib.sample(args.batch)) for _ in range(8)]
        self.tds = [self._td(rng.exponential(1.0, args.batch)) for _ in range(8)]

    def _td(self, td):
        if isinstance(self.lib, TorchRLPlain):
            return self.lib.torch.from_numpy(td.astype(np.float32))
        return td

    def add(self) -> float:
        i = [0]

        def op():
            self.lib.add(self.chunks[i[0] & 7])
            i[0] += 1

        return timed(op, self.args.chunk, self.args.seconds, after=self.lib.sync)

    def sample(self) -> float:
        return timed(lambda: self.lib.sample(self.args.batch), self.args.batch, self.args.seconds)

    def update(self) -> float:
        # fresh indices (the add measurement overwrote slots: mpirl would drop stale ones)
        self.keys = [self.lib.update_args(self.lib.sample(self.args.batch)) for _ in range(8)]
        i = [0]

        def op():
            self.lib.update(self.keys[i[0] & 7], self.tds[i[0] & 7])
            i[0] += 1

        return timed(op, self.args.batch, self.args.seconds)

    def step(self) -> float:
        i = [0]

        def op():
            self.lib.step(self.args.batch, self.tds[i[0] & 7])
            i[0] += 1

        return timed(op, 1, self.args.seconds)


def make(name, capacity, spec, args, rng):
    try:
        return Bench(ADAPTERS[name], capacity, spec, args, rng), None
    except ImportError as e:
        return None, f"not installed ({e.name or e})"
    except Exception as e:  # noqa: BLE001 - a competitor that breaks must not hide the others
        return None, f"failed: {type(e).__name__}: {e}"[:120]


def fmt_rate(x: float) -> str:
    if x >= 1e6:
        return f"{x / 1e6:.2f} M"
    if x >= 1e3:
        return f"{x / 1e3:.1f} k"
    return f"{x:.0f}"


def run(args) -> None:
    rng = np.random.default_rng(0)
    libs = [s.strip() for s in args.libs.split(",") if s.strip()]
    results: dict[tuple[str, str], list[float]] = {}
    notes: dict[str, str] = {}
    display = {k: ADAPTERS[k].name for k in libs}
    rows = [
        ("cartpole", "add", "add, chunks of 64", "transitions/s"),
        ("cartpole", "sample", "sample 512 + weights", "transitions/s"),
        ("cartpole", "update", "update 512 priorities", "priorities/s"),
        ("cartpole", "step", "learner step (sample 512 + update 512)", "steps/s"),
    ]
    for shape, capacity in (("cartpole", args.capacity), ("atari", args.atari_capacity)):
        if capacity <= 0:
            continue
        if shape == "atari":
            rows += [
                ("atari", "add", "Atari add, chunks of 64", "transitions/s"),
                ("atari", "sample", "Atari sample 512 + weights", "transitions/s"),
            ]
        metrics = [m for s, m, _, _ in rows if s == shape]
        spec = shape_spec(shape)
        benches = {}
        for k in libs:  # every library alive at once, interleaved inside each repeat
            if k in notes:
                continue
            t = time.perf_counter()
            b, why = make(k, capacity, spec, args, rng)
            if b is None:
                notes[k] = why
                print(f"# {display[k]}: {why}", file=sys.stderr)
            else:
                benches[k] = b
                print(
                    f"# {display[k]}: {shape} filled {capacity} in {time.perf_counter() - t:.1f} s",
                    file=sys.stderr,
                )
        for r in range(args.repeats):
            for metric in metrics:
                for k, b in benches.items():
                    results.setdefault((k, f"{shape}-{metric}"), []).append(getattr(b, metric)())
            print(f"# {shape} repeat {r + 1}/{args.repeats} done", file=sys.stderr)
        b = None
        benches.clear()  # free this shape's memories before the next shape
        gc.collect()
    report(args, libs, display, rows, results, notes)


def report(args, libs, display, rows, results, notes) -> None:
    import importlib.metadata as md

    def ver(p):
        try:
            return md.version(p)
        except md.PackageNotFoundError:
            return "-"

    med = {key: statistics.median(v) for key, v in results.items()}
    others = [k for k in libs if k != "cpprb"]
    print(
        f"\nPrioritized replay, median of {args.repeats} repeats of {args.seconds} s; "
        f"CartPole capacity {args.capacity}, Atari capacity {args.atari_capacity}; "
        f"alpha {ALPHA}, beta {BETA}, batch {args.batch}, chunk {args.chunk}."
    )
    try:
        import torch

        threads = torch.get_num_threads()
    except ImportError:
        threads = "-"
    print(
        f"Python {platform.python_version()}, numpy {np.__version__}, cpprb {ver('cpprb')}, "
        f"torchrl {ver('torchrl')}, torch {ver('torch')} ({threads} threads), "
        f"{os.cpu_count()} CPUs, {platform.machine()}.\n"
    )
    head = (
        ["operation", "unit"]
        + [display[k] for k in libs]
        + [f"{display[k]} / cpprb" for k in others if "cpprb" in libs]
    )
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for shape, metric, label, unit in rows:
        key = f"{shape}-{metric}"
        cells = [label, unit]
        for k in libs:
            if (k, key) in med:
                cells.append(fmt_rate(med[(k, key)]))
            else:
                cells.append(
                    "not installed"
                    if notes.get(k, "").startswith("not installed")
                    else "failed (see below)"
                    if k in notes
                    else "n/a"
                )
        if "cpprb" in libs:
            base = med.get(("cpprb", key))
            for k in others:
                v = med.get((k, key))
                cells.append(f"{v / base:.2f}x" if v and base else "n/a")
        print("| " + " | ".join(cells) + " |")
    for k, why in notes.items():
        print(f"\n{display[k]}: {why}")
    if "mpirl" in libs and "cpprb" in libs:
        print()
        for key, label, target in [
            ("cartpole-step", "learner step", 2.0),
            ("cartpole-add", "add", 1.0),
            ("cartpole-sample", "sample", 1.5),
        ]:
            a, b = med.get(("mpirl", key)), med.get(("cpprb", key))
            if a and b:
                ok = "met" if a / b >= target else "MISSED"
                print(f"target {label} >= {target:.1f}x cpprb: {a / b:.2f}x, {ok}")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--capacity", type=int, default=2**20)
    p.add_argument(
        "--atari-capacity",
        type=int,
        default=2**15,
        help="capacity of the Atari-shaped rows (0 = skip); every library holds "
        "~56 kB per transition, all at once (~1.9 GB each at 2**15)",
    )
    p.add_argument("--seconds", type=float, default=0.3, help="length of one measurement")
    p.add_argument("--batch", type=int, default=512)
    p.add_argument("--chunk", type=int, default=64)
    p.add_argument("--fill-chunk", type=int, default=8192)
    p.add_argument(
        "--libs",
        default="mpirl,cpprb,torchrl,torchrl-td",
        help="comma-separated subset of " + ",".join(ADAPTERS),
    )
    run(p.parse_args(argv))


if __name__ == "__main__":
    main()
