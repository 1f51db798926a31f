"""Message tags and layouts: every message is one flat uint8 numpy buffer, never a pickle.

Layout of every message: a 40-byte header, then the kind's arrays back to back (8-byte arrays
first, so they stay aligned)::

    header  magic u4 | kind u2 | version u2 | count i8 | seq i8 | a f8 | b f8

==========  ====================  ============================================================
tag/kind    direction             header fields, then arrays
==========  ====================  ============================================================
EXPERIENCE  actor -> buffer       count=n, seq=msg no, a=env steps since last, b=k returns;
                                  returns f8[k], td_abs f4[n], records[n]
CREDIT      buffer -> actor,      count=tokens granted, a=samples drawn by the learner so far
            learner -> buffer
WEIGHTS     learner -> buffer     seq=version, a=learner updates; params f4[P]
            -> actors
FORWARD     buffer -> learner     (replay_at=learner) count=n, seq=msg no; td_abs f4[n],
                                  records[n]  (td_abs: the actors' initial priorities)
BATCH       buffer -> learner     (replay_at=buffer) count=B, seq=batch id, a=send time (buffer
                                  clock); indices i8[B], generations i8[B], weights f4[B],
                                  priorities f4[B], records[B]
PRIORITIES  learner -> buffer     count=B, seq=batch id, a=echo of BATCH.a; timing f8[2]
                                  (hold: arrival -> update sent, step: mean update time, s),
                                  indices i8[B], generations i8[B], td_abs f4[B]
STATS       buffer -> learner     count=k returns, a=site env steps (total), b=site episodes;
                                  returns f8[k]
STOP        learner -> buffer     seq=id of the final checkpoint each rank writes before its
            -> actors             DONE (-1: none)
DONE        actor -> buffer,      a=env steps (total), b=episodes (total)
            buffer -> learner
CHECKPOINT  learner -> buffer     request: seq=checkpoint id; the buffer forwards it to its
            -> actors             actors
            actor -> buffer,      ack: seq=checkpoint id, a=env steps (total) at the snapshot;
            buffer -> learner     the sender's part is on disk.  After an ack the receiver
                                  holds that sender's later messages until its own snapshot
                                  (a consistent cut: see mpirl.checkpoint, docs/reliability.md)
==========  ====================  ============================================================

``records`` use the run's transition dtype (``transition_dtype``): obs, action, reward (the
n-step return), next_obs (n steps later), discount (gamma^k, 0 if the episode terminated).
"""

from __future__ import annotations

from enum import IntEnum
from typing import NamedTuple

import numpy as np

MAGIC = 0x4D50524C  # "MPRL"
VERSION = 2  # 2: CHECKPOINT, STOP.seq = final checkpoint id

HEADER = np.dtype([("magic", "<u4"), ("kind", "<u2"), ("version", "<u2"), ("count", "<i8"),
                   ("seq", "<i8"), ("a", "<f8"), ("b", "<f8")])
assert HEADER.itemsize == 40


class Tag(IntEnum):
    EXPERIENCE = 1
    CREDIT = 2
    WEIGHTS = 3
    FORWARD = 4
    BATCH = 5
    PRIORITIES = 6
    STATS = 7
    STOP = 8
    DONE = 9
    CHECKPOINT = 10


class WireError(RuntimeError):
    """A message that does not match its expected layout."""


def transition_dtype(obs_shape: tuple[int, ...], obs_dtype) -> np.dtype:
    return np.dtype([("obs", obs_dtype, obs_shape), ("action", "<i8"), ("reward", "<f4"),
                     ("next_obs", obs_dtype, obs_shape), ("discount", "<f4")])


class Message(NamedTuple):
    kind: Tag
    count: int
    seq: int
    a: float
    b: float
    arrays: dict


def _header(kind: Tag, count=0, seq=0, a=0.0, b=0.0) -> np.ndarray:
    h = np.zeros(1, HEADER)
    h[0] = (MAGIC, int(kind), VERSION, count, seq, a, b)
    return h


def pack(kind: Tag, arrays=(), count=0, seq=0, a=0.0, b=0.0) -> np.ndarray:
    """Header + arrays -> one uint8 buffer (one copy)."""
    parts = [_header(kind, count, seq, a, b).view(np.uint8)]
    parts += [np.ascontiguousarray(x).view(np.uint8).reshape(-1) for x in arrays]
    return np.concatenate(parts) if len(parts) > 1 else parts[0].copy()


class Wire:
    """Packs and unpacks every kind for one run (the transition dtype and parameter count)."""

    def __init__(self, record_dtype: np.dtype, n_params: int):
        self.record = np.dtype(record_dtype)
        self.n_params = int(n_params)

    def _spec(self, kind: Tag, count: int, b: float) -> list[tuple[str, np.dtype, int]]:
        f8, f4, i8, rec = np.dtype("<f8"), np.dtype("<f4"), np.dtype("<i8"), self.record
        if kind == Tag.EXPERIENCE:
            return [("returns", f8, int(b)), ("td_abs", f4, count), ("records", rec, count)]
        if kind == Tag.FORWARD:
            return [("td_abs", f4, count), ("records", rec, count)]
        if kind == Tag.BATCH:
            return [("indices", i8, count), ("generations", i8, count), ("weights", f4, count),
                    ("priorities", f4, count), ("records", rec, count)]
        if kind == Tag.PRIORITIES:
            return [("timing", f8, 2), ("indices", i8, count), ("generations", i8, count),
                    ("td_abs", f4, count)]
        if kind == Tag.WEIGHTS:
            return [("params", f4, self.n_params)]
        if kind == Tag.STATS:
            return [("returns", f8, count)]
        return []

    def unpack(self, buf: np.ndarray, tag: int, source: str = "?") -> Message:
        """Check and view a received buffer (no copy). WireError names the sender and the kind."""
        where = f"message with tag {tag} from {source}"
        if buf.nbytes < HEADER.itemsize:
            raise WireError(f"{where}: {buf.nbytes} bytes is shorter than the 40-byte header")
        h = buf[: HEADER.itemsize].view(HEADER)[0]
        if int(h["magic"]) != MAGIC:
            raise WireError(f"{where}: bad magic {int(h['magic']):#x} (not an mpirl message)")
        if int(h["version"]) != VERSION:
            raise WireError(f"{where}: wire version {int(h['version'])}, this rank speaks "
                            f"{VERSION}; run the same mpirl version on every rank")
        try:
            kind = Tag(int(h["kind"]))
        except ValueError:
            raise WireError(f"{where}: unknown kind {int(h['kind'])}") from None
        if kind != tag:
            raise WireError(f"{where}: header says {kind.name}, tag says {tag}")
        count, b = int(h["count"]), float(h["b"])
        if count < 0 or b < 0 or b > 1e9:
            raise WireError(f"{where}: bad counts (count={count}, b={b})")
        arrays, off = {}, HEADER.itemsize
        spec = self._spec(kind, count, b)
        need = HEADER.itemsize + sum(dt.itemsize * n for _, dt, n in spec)
        if need != buf.nbytes:
            raise WireError(f"{where}: {kind.name} with count={count} must be {need} bytes, "
                            f"got {buf.nbytes} (mismatched observation shape or version?)")
        for name, dt, n in spec:
            arrays[name] = buf[off: off + dt.itemsize * n].view(dt)
            off += dt.itemsize * n
        return Message(kind, count, int(h["seq"]), float(h["a"]), b, arrays)

    # ---- packers, one per kind (documented in the module docstring) --------------------------
    def experience(self, records, td_abs, returns, env_steps: int, seq: int) -> np.ndarray:
        returns = np.asarray(returns, "<f8")
        return pack(Tag.EXPERIENCE, [returns, np.asarray(td_abs, "<f4"), records],
                    count=len(records), seq=seq, a=env_steps, b=len(returns))

    def forward(self, records, td_abs, seq: int) -> np.ndarray:
        return pack(Tag.FORWARD, [np.asarray(td_abs, "<f4"), records], count=len(records),
                    seq=seq)

    def batch(self, sample, batch_id: int, t_send: float) -> np.ndarray:
        return pack(Tag.BATCH, [np.asarray(sample.indices, "<i8"),
                                np.asarray(sample.generations, "<i8"),
                                np.asarray(sample.weights, "<f4"),
                                np.asarray(sample.priorities, "<f4"), sample.records],
                    count=len(sample.indices), seq=batch_id, a=t_send)

    def priorities(self, indices, generations, td_abs, batch_id: int, t_echo: float,
                   hold: float = 0.0, step: float = 0.0):
        return pack(Tag.PRIORITIES, [np.array([hold, step], "<f8"), np.asarray(indices, "<i8"),
                                     np.asarray(generations, "<i8"), np.asarray(td_abs, "<f4")],
                    count=len(indices), seq=batch_id, a=t_echo)

    def weights(self, params: np.ndarray, version: int, updates: int) -> np.ndarray:
        return pack(Tag.WEIGHTS, [np.asarray(params, "<f4")], seq=version, a=updates)

    @staticmethod
    def credit(tokens: int, samples: float = 0.0) -> np.ndarray:
        return pack(Tag.CREDIT, count=tokens, a=samples)

    @staticmethod
    def stats(returns, env_steps: int, episodes: int) -> np.ndarray:
        returns = np.asarray(returns, "<f8")
        return pack(Tag.STATS, [returns], count=len(returns), a=env_steps, b=episodes)

    @staticmethod
    def stop(checkpoint: int = -1) -> np.ndarray:
        return pack(Tag.STOP, seq=checkpoint)

    @staticmethod
    def checkpoint(ckpt_id: int, env_steps: int = 0) -> np.ndarray:
        return pack(Tag.CHECKPOINT, seq=ckpt_id, a=env_steps)

    @staticmethod
    def done(env_steps: int, episodes: int) -> np.ndarray:
        return pack(Tag.DONE, a=env_steps, b=episodes)
