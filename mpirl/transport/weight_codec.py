"""Weight encodings for the learner's broadcasts (``--weights-encoding``): pure numpy, no MPI.

``full``   the float32 vector as is (4 bytes a parameter).
``bf16``   each float32 rounded to bfloat16 (round to nearest even; 2 bytes a parameter).
``delta``  the change from the weights the receiver holds, ``d = w - base``, quantized to int8
           with one scale per block of ``BLOCK`` parameters, ``s = max|d_block| / 127``,
           ``q = round(d / s)``; the receiver rebuilds ``base + s * q`` (|error| <= s / 2 per
           parameter).  The sender keeps the same rebuilt vector as the next base, so the
           quantization error of one delta is corrected by the next (error feedback): the
           receiver is never further than one step's error from the learner's weights, however
           many deltas it has applied.  The message is zstd-compressed on the wire (most q are
           small), and carries crc32 of the rebuilt float32 bytes: the receiver checks it and
           asks for a keyframe (a ``full`` message) when it differs.  `KeyframeSchedule` sends
           one every K broadcasts and whenever the receiver holds nothing the sender knows of
           (the first broadcast, after a resume, after a request).
"""

from __future__ import annotations

import zlib

import numpy as np

ENCODINGS = ("full", "bf16", "delta")
FULL, BF16, DELTA = 0, 1, 2  # WEIGHTS.count: the encoding of the message
BLOCK = 1024  # parameters per delta scale


def to_bf16(x: np.ndarray) -> np.ndarray:
    """float32 -> the upper 16 bits of the nearest bfloat16 (round half to even), as uint16."""
    u = np.ascontiguousarray(x, np.float32).view(np.uint32)
    rounded = u + (np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1)))
    return (rounded >> np.uint32(16)).astype(np.uint16)


def from_bf16(h: np.ndarray) -> np.ndarray:
    """uint16 bfloat16 bits -> float32."""
    return (h.astype(np.uint32) << np.uint32(16)).view(np.float32)


def n_blocks(n: int) -> int:
    return -(-n // BLOCK)


def quantize(d: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A float32 change -> (scales f4[n_blocks], q i1[n]) with ``s = max|d| / 127`` a block."""
    n = d.size
    pad = n_blocks(n) * BLOCK - n
    blocks = (
        np.concatenate([d, np.zeros(pad, np.float32)]).reshape(-1, BLOCK)
        if pad
        else d.reshape(-1, BLOCK)
    )
    scales = (np.abs(blocks).max(axis=1) / np.float32(127)).astype(np.float32)
    safe = np.where(scales > 0, scales, np.float32(1))
    q = np.rint(blocks / safe[:, None]).astype(np.int8).reshape(-1)[:n]
    return scales, q


def dequantize(scales: np.ndarray, q: np.ndarray) -> np.ndarray:
    """(scales, q) -> the float32 change ``s * q`` (the same arithmetic on every rank)."""
    n = q.size
    s = np.repeat(scales.astype(np.float32), BLOCK)[:n]
    return s * q.astype(np.float32)


def checksum(w: np.ndarray) -> int:
    """crc32 of the float32 bytes: sender and receiver rebuild bit-identical vectors."""
    return zlib.crc32(np.ascontiguousarray(w, np.float32).view(np.uint8).data)


def encode_delta(w: np.ndarray, base: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(scales, q, rebuilt): what to send so a receiver holding ``base`` rebuilds ``rebuilt``."""
    scales, q = quantize(np.asarray(w, np.float32) - base)
    return scales, q, apply_delta(base, scales, q)


def apply_delta(base: np.ndarray, scales: np.ndarray, q: np.ndarray) -> np.ndarray:
    return (base + dequantize(scales, q)).astype(np.float32, copy=False)


class KeyframeSchedule:
    """When the next broadcast to one receiver is a keyframe: every ``every`` broadcasts, and
    whenever the sender does not know what the receiver holds (``base is None``) or it asked."""

    def __init__(self, every: int) -> None:
        self.every = int(every)
        self.since = 0  # deltas since the last keyframe that entered the wire
        self.requested = False

    def key_due(self, have_base: bool) -> bool:
        return not have_base or self.requested or self.since + 1 >= self.every

    def sent(self, key: bool) -> None:
        """A broadcast entered the wire (a keyframe or a delta)."""
        self.since = 0 if key else self.since + 1
        if key:
            self.requested = False


class WeightCache:
    """A receiver's latest weights (the buffer's cache for its site): version, learner updates
    when they were made, the float32 vector.  ``apply`` takes a decoded WEIGHTS message."""

    def __init__(self) -> None:
        self.version = -1
        self.updates = 0
        self.params: np.ndarray | None = None

    def apply(self, encoding: int, version: int, updates: int, arrays: dict) -> bool:
        """Rebuild the weights of a message; False (and nothing changes) when a delta does not
        apply: its base is not the version held, or the checksum differs (ask for a keyframe)."""
        if encoding == FULL:
            params = np.array(arrays["params"], np.float32)
        elif encoding == BF16:
            params = from_bf16(arrays["params"])
        else:
            base_version, crc = (int(x) for x in arrays["meta"])
            if self.params is None or base_version != self.version:
                return False
            params = apply_delta(self.params, arrays["scales"], arrays["q"])
            if checksum(params) != crc:
                return False
        self.version, self.updates, self.params = version, updates, params
        return True
