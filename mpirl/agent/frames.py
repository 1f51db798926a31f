"""Image observations stored once per frame: the actor's frame log and frame-table helpers (pure).

An image observation is ``stack`` frames (Atari: 4 x [1, 84, 84]; MinAtar: 1 x [C, 10, 10]).
Consecutive observations of one env share ``stack - 1`` frames, and an n-step transition's
``next_obs`` shares frames with later transitions' ``obs``: storing ``obs`` and ``next_obs`` as
arrays would hold every Atari frame up to 8 times.  So, in image runs, every message and the
replay memory carry

* a **frame table** ``frames: uint8 [f, *frame_shape]`` holding each frame once, and
* **records** of ``record_dtype(stack)``: ``action i8, reward f4, discount f4, frames i8[2S]``,
  where ``frames[:S]`` index the table for ``obs`` (oldest first) and ``frames[S:]`` for
  ``next_obs``.

On the wire the indices are local to the message's table (messages are self-contained: any
receiver rebuilds every stack from the message alone, and forwarding, sampling and concatenating
messages from many interleaved actors needs no per-actor state).  In the replay memory
(`mpirl.replay.frames.FrameReplay`) they are serial numbers in a ring of frames.  The cost of
self-contained messages: a message repeats, per env stream, the ``stack - 1`` frames before its
first transition and the ``n`` frames after its last one.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np


def record_dtype(stack: int) -> np.dtype:
    return np.dtype(
        [("action", "<i8"), ("reward", "<f4"), ("discount", "<f4"), ("frames", "<i8", (2 * stack,))]
    )


def frames_per_transition(stack: int, n_step: int, envs_per_actor: int, actor_chunk: int) -> float:
    """Expected frames per transition in actor messages (and so in the replay memory).

    Per message of ``actor_chunk`` transitions from ``envs_per_actor`` streams, each stream adds
    ``stack - 1`` history frames and ``n_step`` look-ahead frames beyond one frame per transition;
    5% more covers episode ends (a terminal frame and a reset frame) and uneven streams.
    """
    extra = (stack - 1 + n_step) * envs_per_actor / max(1, actor_chunk)
    return 1.05 * (1.0 + extra)


class FrameLog:
    """Actor side: every frame an env produces gets an id once; a stack is a tuple of ids."""

    def __init__(self, stack: int, frame_shape: tuple[int, ...]) -> None:
        self.stack = stack
        self.frame_shape = tuple(frame_shape)
        self.c = frame_shape[0]
        self.frames: dict[int, np.ndarray] = {}
        self.next_id = 0

    def _add(self, frame: np.ndarray) -> int:
        fid = self.next_id
        self.frames[fid] = np.array(frame, np.uint8, copy=True)
        self.next_id += 1
        return fid

    def reset(self, obs: np.ndarray) -> tuple[int, ...]:
        """First observation of an episode: FrameStackObservation(padding_type='reset') repeats
        the reset frame ``stack`` times."""
        return (self._add(obs[-self.c :]),) * self.stack

    def step(self, ids: tuple[int, ...], obs: np.ndarray) -> tuple[int, ...]:
        """The stack after a step: the oldest frame drops out, the newest comes in."""
        return ids[1:] + (self._add(obs[-self.c :]),)

    def pack(
        self, obs_ids: Sequence[tuple[int, ...]], next_ids: Sequence[tuple[int, ...]]
    ) -> tuple[np.ndarray, np.ndarray]:
        """(k, 2S) int64 local indices and the frame table holding each referenced frame once."""
        k = len(obs_ids)
        if k == 0:
            return np.zeros((0, 2 * self.stack), np.int64), self.empty()
        ids = np.concatenate(
            [np.asarray(obs_ids, np.int64), np.asarray(next_ids, np.int64)], axis=1
        )
        uniq, inv = np.unique(ids, return_inverse=True)
        table = np.stack([self.frames[int(i)] for i in uniq])
        return inv.reshape(ids.shape).astype(np.int64), table

    def adopt(self, table: np.ndarray) -> int:
        """Take over a frame table (a resumed checkpoint): returns the id of its first frame;
        table row i gets id ``first + i``."""
        first = self.next_id
        for frame in table:
            self._add(frame)
        return first

    def prune(self, keep_from: int) -> None:
        """Forget frames with ids below ``keep_from`` (nothing pending refers to them)."""
        for fid in [f for f in self.frames if f < keep_from]:
            del self.frames[fid]

    def empty(self) -> np.ndarray:
        return np.zeros((0,) + self.frame_shape, np.uint8)


def stacks(records: np.ndarray, frames: np.ndarray, stack: int) -> tuple[np.ndarray, np.ndarray]:
    """(obs, next_obs) as uint8 [k, stack * C, H, W] from records with indices into ``frames``."""
    idx = records["frames"]
    k = idx.shape[0]
    c, h, w = frames.shape[1:]
    obs = frames[idx[:, :stack]].reshape(k, stack * c, h, w)
    nxt = frames[idx[:, stack:]].reshape(k, stack * c, h, w)
    return obs, nxt


def concat(groups: Iterable[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """Join (records, frames) groups into one: indices shifted by the frames before them."""
    recs, tables, off = [], [], 0
    for r, f in groups:
        r = np.array(r, copy=True)
        r["frames"] += off
        off += len(f)
        recs.append(r)
        tables.append(f)
    return np.concatenate(recs), np.concatenate(tables)


def compact(records: np.ndarray, frames: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Keep only the frames the records refer to (after slicing a group)."""
    used, inv = np.unique(records["frames"], return_inverse=True)
    if len(used) == len(frames):
        return records, frames
    r = np.array(records, copy=True)
    r["frames"] = inv.reshape(r["frames"].shape)
    return r, frames[used]
