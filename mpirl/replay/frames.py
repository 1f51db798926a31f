"""Prioritized replay for image observations: every frame stored once (a frame ring).

``FrameReplay`` = a ring of frames ``uint8 [F, *frame_shape]`` + a `PrioritizedReplay` of small
records (``mpirl.agent.frames.record_dtype``: action, reward, discount and the serial numbers of the
``2 * stack`` frames of ``obs`` and ``next_obs``).  A group (one message: records with indices into
its own frame table) is added by appending its frames to the ring and shifting its indices to
frame serial numbers; a sample gathers each distinct frame of the batch once and hands back a
group again (records with indices into the batch's own frame table), which is what the wire
carries and what `mpirl.agent.frames.stacks` turns into ``obs`` / ``next_obs`` arrays.

Frames and transitions are both inserted in arrival order, so they age together.  The frame ring
holds ``F = ceil(capacity * frames_per_transition)`` frames.  When appending a group would
overwrite a frame that a live transition still refers to, the transitions of the oldest groups are
*retired* first (their priorities leave the sum/min trees, priority updates for them are dropped
as stale, exactly as for an overwritten slot): a transition is never sampled with a foreign frame.
If messages carry more frames per transition than planned, the memory holds fewer transitions than
its capacity (``len``) instead of failing.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any

import numpy as np

from mpirl.agent.frames import record_dtype
from mpirl.replay.memory import (
    PrioritizedReplay,
    Rows,
    Sample,
    _mb,
    available_memory,
    copy_rows,
    footprint_bytes,
)


def frame_footprint_bytes(
    capacity: int, stack: int, frame_shape: tuple[int, ...], frames_per_transition: float
) -> int:
    """Bytes a ``FrameReplay`` allocates: the transition memory plus the frame ring."""
    n_frames = frame_capacity(capacity, frames_per_transition)
    return footprint_bytes(capacity, record_dtype(stack)) + n_frames * int(np.prod(frame_shape))


def frame_capacity(capacity: int, frames_per_transition: float) -> int:
    return int(math.ceil(capacity * max(1.0, frames_per_transition)))


class _RetiringReplay(PrioritizedReplay):
    """PrioritizedReplay whose oldest transitions can be retired before their slots are reused."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self._tail = 0  # serial number of the oldest transition not retired

    def _oldest(self) -> int:
        return max(self._tail, self._n - self._capacity)

    @property
    def size(self) -> int:
        return self._n - self._oldest()

    def __len__(self) -> int:
        return self._n - self._oldest()

    def retire(self, upto: int) -> int:
        """Retire every transition with serial number < ``upto``; returns how many."""
        lo, hi = self._oldest(), min(int(upto), self._n)
        if hi <= lo:
            return 0
        cap, tree = self._capacity, self._tree
        s = lo % cap
        first = min(hi - lo, cap - s)
        for start, k in ((s, first), (0, hi - lo - first)):
            if k:
                a, b = tree.n_leaves + start, tree.n_leaves + start + k
                tree.sum[a:b] = 0.0
                tree.min[a:b] = np.inf
                tree._dirty.append([a, b])
        tree.flush()
        self._tail = hi
        return hi - lo

    def update(self, indices: np.ndarray, generations: np.ndarray, td_abs: np.ndarray) -> int:
        gen = np.asarray(generations)
        live = gen >= self._tail
        if live.all():
            return super().update(indices, generations, td_abs)
        dropped = int(live.size - np.count_nonzero(live))
        if not live.any():
            return dropped
        return dropped + super().update(
            np.asarray(indices)[live], gen[live], np.asarray(td_abs)[live]
        )


class FrameReplay:
    """Prioritized replay of image transitions with each frame stored once (see module doc).

    The interface of `PrioritizedReplay`, frames added: ``add(records, td_abs, frames)`` takes a
    group (records' ``frames`` index ``frames``); ``sample(B)`` returns a `Sample` whose
    ``frames`` is the batch's table, indexed by its records;
    ``update`` is PrioritizedReplay's (generation-checked, retired transitions count as stale).
    """

    def __init__(
        self,
        capacity: int,
        stack: int,
        frame_shape: tuple[int, ...],
        frames_per_transition: float,
        alpha: float = 0.6,
        beta: float = 0.4,
        eps: float = 1e-6,
        seed: int | None = None,
        max_bytes: int | None = None,
    ) -> None:
        self.stack = int(stack)
        self.frame_shape = tuple(frame_shape)
        self.frame_capacity = frame_capacity(capacity, frames_per_transition)
        need = frame_footprint_bytes(capacity, stack, frame_shape, frames_per_transition)
        avail = available_memory()[0] if max_bytes is None else int(max_bytes)
        frame_bytes = self.frame_capacity * int(np.prod(self.frame_shape))
        if avail is not None and need > avail:
            per = need / capacity
            raise ValueError(
                f"replay capacity={capacity} needs {_mb(need)} ({_mb(frame_bytes)} frame ring of "
                f"{self.frame_capacity} frames + transitions and trees) but only {_mb(avail)} is "
                f"available; lower the capacity to at most {int(avail * 0.9 / per)} transitions"
            )
        self.memory = _RetiringReplay(
            capacity,
            record_dtype(stack),
            alpha=alpha,
            beta=beta,
            eps=eps,
            seed=seed,
            max_bytes=None if avail is None else avail - frame_bytes,
        )
        self.frames = np.zeros((self.frame_capacity,) + self.frame_shape, np.uint8)
        self.frames_in = 0  # frames ever added (serial number of the next one)
        self._groups: deque = deque()  # (transition serial end, first frame serial) per group
        self.retired = 0
        self.footprint = need

    # the PrioritizedReplay interface the roles use
    def __len__(self) -> int:
        return len(self.memory)

    @property
    def capacity(self) -> int:
        return self.memory.capacity

    @property
    def beta(self) -> float:
        return self.memory.beta

    @beta.setter
    def beta(self, value: float) -> None:
        self.memory.beta = value

    @property
    def inserted(self) -> int:
        return self.memory.inserted

    def add(
        self, records: np.ndarray, td_abs: np.ndarray, frames: np.ndarray | None = None
    ) -> np.ndarray:
        """Insert a group: ``records`` whose ``frames`` field indexes the group's own frame table
        ``frames``; the same call as `PrioritizedReplay.add` with the table added."""
        if frames is None:
            raise ValueError(
                "add(): a memory of image observations needs the group's frame table (frames=...)"
            )
        f = len(frames)
        cap_f = self.frame_capacity
        if f > cap_f:
            raise ValueError(
                f"add(): a group of {f} frames does not fit the frame ring of "
                f"{cap_f}; raise the replay capacity"
            )
        if len(records) and (records["frames"].min() < 0 or records["frames"].max() >= f):
            raise ValueError(f"add(): frame indices outside the group's table of {f} frames")
        base = self.frames_in
        cutoff = base + f - cap_f  # frames with serial < cutoff are overwritten now
        mem = self.memory
        while self._groups and (
            self._groups[0][1] < cutoff or self._groups[0][0] <= mem.inserted - mem.capacity
        ):
            t_end, f_start = self._groups.popleft()
            if f_start < cutoff:
                self.retired += mem.retire(t_end)
        s = base % cap_f
        first = min(f, cap_f - s)
        self.frames[s : s + first] = frames[:first]
        self.frames[: f - first] = frames[first:]
        self.frames_in += f
        recs = np.array(records, copy=True)
        recs["frames"] += base
        slots = mem.add(recs, td_abs)
        self._groups.append((mem.inserted, base))
        return slots

    def sample(self, batch_size: int, rng: np.random.Generator | None = None) -> Sample:
        """A batch as `PrioritizedReplay.sample` gives it, with ``frames`` the batch's own frame
        table (each distinct frame once) that ``records["frames"]`` index."""
        s = self.memory.sample(batch_size, rng)
        serial = s.records["frames"]
        assert serial.min() >= self.frames_in - self.frame_capacity, "frame overwritten"
        uniq, inv = np.unique(serial, return_inverse=True)
        table = self.frames[uniq % self.frame_capacity]
        recs = s.records
        recs["frames"] = inv.reshape(serial.shape)
        return s._replace(frames=table)

    def update(self, indices: np.ndarray, generations: np.ndarray, td_abs: np.ndarray) -> int:
        return self.memory.update(indices, generations, td_abs)

    def max_weight(self) -> float:
        return self.memory.max_weight()

    def total_priority(self) -> float:
        return self.memory.total_priority()

    @property
    def dtype(self) -> np.dtype:
        return self.memory.dtype

    # ---- checkpoints (numpy arrays and JSON-able scalars, no pickle) ---------------------------
    def checkpoint_state(self, prefix: str = "replay_") -> tuple[dict, dict]:
        """(arrays, meta): the slots and frames in use, the ring cursors and retired tail."""
        mem = self.memory
        sd = mem.state_dict()
        n = min(mem.inserted, mem.capacity)  # the ring fills from slot 0
        f = min(self.frames_in, self.frame_capacity)
        # views, no copy (a checkpoint must not double the memory); retired slots hold p = 0
        # here, restore_checkpoint retires them again from the tail
        arrays = {
            f"{prefix}storage": sd["storage"][:n],
            f"{prefix}priorities": sd["priorities"][:n],
            f"{prefix}frames": self.frames[:f],
            f"{prefix}groups": np.array(self._groups, np.int64).reshape(-1, 2),
        }
        if "rng_state" in sd:
            arrays[f"{prefix}rng_state"] = sd["rng_state"]
        meta = {k: sd[k] for k in ("inserted", "capacity", "alpha", "beta", "eps")}
        meta.update(
            frames_in=int(self.frames_in),
            frame_capacity=int(self.frame_capacity),
            tail=int(mem._tail),
            retired=int(self.retired),
        )
        return arrays, meta

    def restore_checkpoint(self, arrays: dict, meta: dict, prefix: str = "replay_") -> None:
        mem = self.memory
        cap, n_in = int(meta["capacity"]), int(meta["inserted"])
        if cap != mem.capacity or int(meta["frame_capacity"]) != self.frame_capacity:
            raise ValueError(
                f"replay memory of {cap:,} transitions / "
                f"{int(meta['frame_capacity']):,} frames in the checkpoint, "
                f"{mem.capacity:,} / {self.frame_capacity:,} configured (same "
                "--replay-capacity, --actor-chunk, --n-step, --envs-per-actor)"
            )
        n = min(n_in, cap)
        stored, prios = arrays[f"{prefix}storage"], arrays[f"{prefix}priorities"]
        frames = arrays[f"{prefix}frames"]
        f = min(int(meta["frames_in"]), self.frame_capacity)
        if (
            stored.shape != (n,)
            or prios.shape != (n,)
            or stored.dtype != mem.dtype
            or frames.shape != (f,) + self.frame_shape
        ):
            raise ValueError(
                "replay memory in the checkpoint does not match this run's "
                f"({stored.dtype} {stored.shape}, frames {frames.shape})"
            )
        # retired slots (p = 0; older checkpoints stored a placeholder): load_state_dict wants
        # p > 0 for every held slot, and retire() below zeroes them again
        floor = float(meta["eps"]) ** float(meta["alpha"])
        d = {
            "storage": stored,
            "priorities": _Held(prios, floor),
            **{k: meta[k] for k in ("inserted", "capacity", "alpha", "beta", "eps")},
        }
        if f"{prefix}rng_state" in arrays:
            d["rng_state"] = np.asarray(arrays[f"{prefix}rng_state"])
        mem.load_state_dict(d)
        mem._tail = 0
        mem.retire(int(meta["tail"]))
        copy_rows(self.frames[:f], frames)
        self.frames_in = int(meta["frames_in"])
        self.retired = int(meta["retired"])
        self._groups = deque((int(a), int(b)) for a, b in np.asarray(arrays[f"{prefix}groups"]))


class _Held:
    """A checkpoint's priorities of the held slots, sliced as `copy_rows` and load_state_dict
    slice them, with the retired slots' 0 (or placeholder) raised to ``floor``."""

    def __init__(self, p: Rows, floor: float) -> None:
        self.p, self.floor, self.shape = p, floor, p.shape

    def __getitem__(self, key: slice) -> np.ndarray:
        x = np.array(self.p[key], np.float64)
        x[x <= 0] = self.floor
        return x
