"""Message tags and layouts: every message is one flat uint8 numpy buffer, never a pickle.

Layout of every message: a 40-byte header, then the kind's arrays back to back (8-byte arrays
first, so they stay aligned)::

    header  magic u4 | kind u2 | version u2 | count i8 | seq i8 | a f8 | b f8

==========  ====================  ============================================================
tag/kind    direction             header fields, then arrays
==========  ====================  ============================================================
EXPERIENCE  actor -> buffer       count=n, seq=msg no, a=env steps since last, b=k returns;
                                  [nframes i8[1]], acting i8[1] (learner updates of the weights
                                  the actor acts with), returns f8[k], td_abs f4[n], records[n],
                                  [frames u8[nframes, *frame]]  ([...]: image runs only)
CREDIT      buffer -> actor,      count=tokens granted, a=samples drawn by the learner so far
            learner -> buffer
WEIGHTS     learner -> buffer     seq=version, a=learner updates, count=encoding
            -> actors             (mpirl.transport.weight_codec): 0 full: params f4[P]; 1 bf16:
                                  params u2[P]; 2 delta: meta i8[2] (base version, crc32 of the
                                  rebuilt f4 bytes), scales f4[ceil(P/1024)], q i1[P], compressed
                                  (FLAG_ZSTD).  Buffer -> actors: always full
KEYFRAME    buffer -> learner     seq=version held; a delta did not apply: send a full one
FORWARD     buffer -> learner     (replay_at=learner, thinned) count=n, seq=msg no, a=the
                                  transitions the site produced that it stands for (0: n; more
                                  when some were thinned out), b=1 when keep follows records;
                                  [nframes i8[1]], td_abs f4[n], records[n], [keep u1[n]],
                                  [frames]  (td_abs: the actors' initial priorities; keep: each
                                  one's probability of being forwarded, --replay-at thinned, as
                                  code k for exp(-k / 16): `keep_code`); may be compressed
                                  (FLAG_ZSTD)
BATCH       buffer -> learner     (replay_at=buffer) count=B, seq=batch id, a=send time (buffer
                                  clock), b=the memory's max weight (weights' normaliser, see
                                  PrioritizedReplay.max_weight; at most 1e9);
                                  [nframes i8[1]], window i8[1]
                                  (the buffer's in-flight window), indices i8[B], generations i8[B],
                                  weights f4[B], priorities f4[B], records[B], [frames];
                                  may be compressed (FLAG_ZSTD)
PRIORITIES  learner -> buffer     count=B, seq=batch id, a=echo of BATCH.a, b=learner
                                  updates so far (the buffers' beta follows it); timing f8[2]
                                  (hold: arrival -> update sent, step: mean update time, s),
                                  indices i8[B], generations i8[B], td_abs f4[B]
STATS       buffer -> learner     count=k returns, a=site env steps (total), b=site episodes,
                                  seq=learner updates of the weights the site holds;
                                  returns f8[k], acting i8[2 x actors heard from]: (site rank,
                                  learner updates of the weights it acts with) pairs
STOP        learner -> buffer     seq=id of the final checkpoint each rank writes before its
            -> actors             DONE (-1: none)
DONE        actor -> buffer,      a=env steps (total), b=episodes (total)
            buffer -> learner
CHECKPOINT  learner -> buffer     request: seq=checkpoint id; the buffer forwards it to its
            -> actors             actors
            actor -> buffer,      ack: seq=checkpoint id, a=env steps (total) at the snapshot
            buffer -> learner     (learner j -> lead: the crc32 of its network and Adam state);
                                  the sender's part is on disk.  After an ack the receiver
                                  holds that sender's later messages until its own snapshot
                                  (a consistent cut: see mpirl.run.checkpoint, docs/reliability.md)
ORDER       lead learner ->       (--learners K) count=B, seq=order id, a=beta, b=importance-
            learner j             weight scale; meta i8[3] (weights version carried, -1: none;
                                  1 = a relayed BATCH follows; how: 0 all-reduce, 1 submit the
                                  gradient, 2 take the lead's state, no batch), body u1[...]:
                                  [online f4[P], target f4[P]] [the buffer's BATCH as it came]
SHARD       lead -> learner j     (replay_at=learner) body u1[...]: a buffer's FORWARD message
GRAD        learner j -> lead     count=n, seq=order id, a=loss, b=compute seconds; meta i8[2]
                                  (weights version used, 1 = a gradient follows), max_weight
                                  f8[1] (its shard's, for a batch it sampled; else 0), td_abs
                                  f4[n], body u1[...]: [gradient f4[P]]
==========  ====================  ============================================================

The learner group (``--learners K``) also uses STOP (finish, then answer DONE), DONE (a=orders
served) and CHECKPOINT (seq=id: write your part; the same kind back once it is on disk) on its
own communicator.  ``u1[...]`` is a variable tail: the rest of the message.

``records`` use the run's transition dtype (``transition_dtype``): obs, action, reward (the
n-step return), next_obs (n steps later), discount (gamma^k, 0 if the episode terminated).

**Image runs** (``Wire(..., frame_shape=...)``, see mpirl.agent.frames): records are
``mpirl.agent.frames.record_dtype(stack)`` (action, reward, discount, frames i8[2S]: indices into
the message's frame table), and EXPERIENCE, FORWARD and BATCH carry two more arrays:
``nframes i8[1]`` first (before every other array) and ``frames u8[nframes, *frame_shape]`` last.

**Flags** live in the high byte of ``kind`` (the tag is the low byte, so the header layout is
unchanged): ``FLAG_ZSTD`` (0x100) = the body after the header is zstd-compressed::

    header (kind = tag | 0x100; count, seq, a, b as uncompressed) | raw_nbytes i8 | zstd frame

``raw_nbytes`` is the size of the uncompressed body; ``unpack`` decompresses and checks it, then
reads the message as usual (``Message.raw_nbytes`` is the uncompressed message size, header
included).  Only FORWARD and BATCH (the experience-carrying kinds that cross the long-haul link)
are compressed, and only when the run compresses (``--compress``: auto = image runs); and every
delta WEIGHTS message (``--weights-encoding delta``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from enum import IntEnum
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from mpirl.transport.weight_codec import BF16, DELTA, FULL, n_blocks

if TYPE_CHECKING:
    from numpy.typing import ArrayLike, DTypeLike

    from mpirl.replay.memory import Sample

MAGIC = 0x4D50524C  # "MPRL"
VERSION = 8  # every rank of a run must speak the same version

HEADER = np.dtype(
    [
        ("magic", "<u4"),
        ("kind", "<u2"),
        ("version", "<u2"),
        ("count", "<i8"),
        ("seq", "<i8"),
        ("a", "<f8"),
        ("b", "<f8"),
    ]
)
assert HEADER.itemsize == 40


MAX_WEIGHT = 1e9  # BATCH.b is clipped here (header b must stay within what unpack accepts)


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
    KEYFRAME = 11
    ORDER = 41
    SHARD = 42
    GRAD = 43


RECORD_KINDS = (Tag.EXPERIENCE, Tag.FORWARD, Tag.BATCH)
_TAGS = {int(t): t for t in Tag}
COMPRESSED_KINDS = (Tag.FORWARD, Tag.BATCH)


#: how a learner makes the update of an ORDER (its ``how``)
ALLREDUCE, SUBMIT, RESYNC = 0, 1, 2


class WireError(RuntimeError):
    """A message that does not match its expected layout."""


def kind_of(buf: np.ndarray) -> Tag:
    """The kind (= MPI tag) a packed message declares in its header: senders take the tag from
    here, never from the call site."""
    return Tag(int(buf[4:6].view("<u2")[0]) & KIND_MASK)


#: FORWARD's keep: probability exp(-k / KEEP_STEPS) as a byte k (6% apart, down to 1.2e-7); the
#: thinned placement draws with the value a code stands for, so the learner's f is exact
KEEP_STEPS = 16.0


def keep_code(f: np.ndarray) -> np.ndarray:
    """The byte that stands for probability ``f`` (the nearest code)."""
    k = np.rint(-KEEP_STEPS * np.log(np.maximum(f, 1e-30)))
    return np.clip(k, 0, 255).astype(np.uint8)


def keep_value(code: np.ndarray) -> np.ndarray:
    """The probability (float32) a code stands for."""
    return np.exp(np.asarray(code, np.float32) / np.float32(-KEEP_STEPS)).astype(np.float32)


def transition_dtype(obs_shape: tuple[int, ...], obs_dtype: DTypeLike) -> np.dtype:
    return np.dtype(
        [
            ("obs", obs_dtype, obs_shape),
            ("action", "<i8"),
            ("reward", "<f4"),
            ("next_obs", obs_dtype, obs_shape),
            ("discount", "<f4"),
        ]
    )


FLAG_ZSTD = 0x100
KIND_MASK = 0xFF
#: zstd level 1: on Atari frames 2-2.5x fewer bytes than lz4 at comparable speed (hundreds of
#: MB/s, far above any WAN rate); higher levels gained ~15% more for 2x the CPU.
#: See docs/images.md.
ZSTD_LEVEL = 1


class Message(NamedTuple):
    """A received message: the header's slots, its arrays (views of ``buf``), and where it came
    from (``rank``: the sender's rank in the communicator; ``t``: when the inbox handed it over).
    `Wire.unpack` returns the view of its kind (`VIEWS`), whose properties name the slots."""

    kind: Tag
    count: int  # type: ignore[assignment]  # the header's slot; shadows tuple.count
    seq: int
    a: float
    b: float
    arrays: dict
    raw_nbytes: int = 0  # uncompressed size (header included) of a compressed message; else 0
    buf: np.ndarray | None = None  # the message as received (relayed as is by some roles)
    rank: int = -1
    t: float = 0.0

    @property
    def nbytes(self) -> int:
        """Bytes received (compressed size, header included)."""
        return 0 if self.buf is None else self.buf.nbytes


def _slot(name: str, cast: Callable[[Any], Any] | None = None, doc: str = "") -> property:
    i = Message._fields.index(name)
    if cast is None:
        return property(lambda m: m[i], doc=doc)
    return property(lambda m: cast(m[i]), doc=doc)


def _array(name: str, doc: str = "") -> property:
    """A named array of the message (None where this message has none, e.g. ``frames`` of a
    vector run)."""
    return property(lambda m: m.arrays.get(name), doc=doc)


class Experience(Message):
    __slots__ = ()
    acting = property(
        lambda m: int(m.arrays["acting"][0]),
        doc="learner updates of the weights the actor acts with",
    )
    returns = _array("returns", "episode returns, f8")
    td_abs = _array("td_abs", "the actor's initial |td|, f4")
    records = _array("records")
    frames = _array("frames", "image runs: the frame table")
    n = _slot("count", doc="transitions")
    msg_no = _slot("seq")
    env_steps = _slot("a", int, "env steps since the actor's last EXPERIENCE")
    n_returns = _slot("b", int, "episode returns carried")


class Credit(Message):
    __slots__ = ()
    tokens = _slot("count", doc="tokens granted")
    samples = _slot("a", doc="samples the learner has drawn so far")


class Weights(Message):
    __slots__ = ()
    encoding = _slot("count", doc="mpirl.transport.weight_codec: FULL, BF16, DELTA")
    version = _slot("seq")
    updates = _slot("a", int, "learner updates when the weights were made")
    params = _array("params", "full: f4[P]; bf16: u2[P]")


class Keyframe(Message):
    __slots__ = ()
    version = _slot("seq", doc="the version the site holds")


class Forward(Message):
    __slots__ = ()
    td_abs = _array("td_abs", "the actors' initial |td|, f4")
    records = _array("records")
    frames = _array("frames", "image runs: the frame table")
    n = _slot("count", doc="transitions")
    msg_no = _slot("seq")

    @property
    def produced(self) -> int:
        """The transitions the site produced that this message stands for (its own and those
        thinned out since the site's previous FORWARD)."""
        return int(self.a) or self.n

    @property
    def keep(self) -> np.ndarray | None:
        """Each one's probability of being forwarded, float32 (None: all 1)."""
        codes = self.arrays.get("keep")
        return None if codes is None else keep_value(codes)


class Batch(Message):
    __slots__ = ()
    window = property(lambda m: int(m.arrays["window"][0]), doc="the buffer's in-flight window")
    indices = _array("indices")
    generations = _array("generations")
    weights = _array("weights", "importance weights, f4")
    priorities = _array("priorities", "stored priorities of the sampled slots, f4")
    records = _array("records")
    frames = _array("frames", "image runs: the frame table")
    n = _slot("count", doc="batch size")
    batch_id = _slot("seq")
    t_send = _slot("a", doc="send time on the buffer's clock (echoed by PRIORITIES)")
    max_weight = _slot("b", doc="the memory's max importance weight (the weights' normaliser)")


class Priorities(Message):
    __slots__ = ()
    timing = _array("timing", "(hold, step) seconds, f8")
    indices = _array("indices")
    generations = _array("generations")
    td_abs = _array("td_abs")
    n = _slot("count", doc="batch size")
    batch_id = _slot("seq")
    t_echo = _slot("a", doc="BATCH.t_send echoed")
    updates = _slot("b", int, "learner updates so far (the buffers' beta follows it)")


class Stats(Message):
    __slots__ = ()
    returns = _array("returns", "episode returns, f8")
    n_returns = _slot("count")
    weights_updates = _slot("seq", doc="learner updates of the weights the site holds")
    env_steps = _slot("a", int, "the site's env steps (total)")
    episodes = _slot("b", int, "the site's episodes (total)")

    @property
    def acting(self) -> tuple[np.ndarray, np.ndarray]:
        """(site ranks, learner updates of the weights each of those actors acts with)."""
        pairs = np.asarray(self.arrays["acting"]).reshape(-1, 2)
        return pairs[:, 0], pairs[:, 1]


class Stop(Message):
    __slots__ = ()
    checkpoint = _slot("seq", doc="id of the final checkpoint (-1: none)")


class Done(Message):
    __slots__ = ()
    env_steps = _slot("a", int, "env steps (total)")
    episodes = _slot("b", int, "episodes (total)")


class Checkpoint(Message):
    __slots__ = ()
    id = _slot("seq", doc="checkpoint id")
    env_steps = _slot("a", int, "ack: env steps (total) at the snapshot")


class Order(Message):
    """A learner-group work order: a batch to compute a gradient on."""

    __slots__ = ()
    n = _slot("count", doc="batch size")
    id = _slot("seq", doc="order id")
    beta = _slot("a", doc="the importance-sampling exponent")
    scale = _slot("b", doc="the importance-weight scale of a relayed batch")
    version = property(lambda m: int(m.arrays["meta"][0]), doc="weights version carried, or -1")
    relayed = property(lambda m: bool(m.arrays["meta"][1]), doc="a buffer's BATCH follows")
    how = property(
        lambda m: int(m.arrays["meta"][2]),
        doc="ALLREDUCE, SUBMIT (the gradient to the lead) or RESYNC (take the lead's state)",
    )

    def weights(self, n_params: int) -> tuple[np.ndarray, np.ndarray] | None:
        """(online, target) float32 (copies: aligned), or None when the order carries none."""
        if self.version < 0:
            return None
        body = self.arrays["body"]
        both = np.frombuffer(body[: 8 * n_params].tobytes(), np.float32)
        return both[:n_params], both[n_params:]

    def batch_buf(self, n_params: int) -> np.ndarray:
        """The relayed BATCH message, as it came over the link (a copy: aligned)."""
        skip = 8 * n_params if self.version >= 0 else 0
        return np.array(self.arrays["body"][skip:])


class Shard(Message):
    """replay_at=learner, --learners K: a FORWARD message for a learner's replay shard."""

    __slots__ = ()
    forward_buf = property(lambda m: np.array(m.arrays["body"]), doc="the FORWARD message")


class Grad(Message):
    """A learner's answer to an ORDER."""

    __slots__ = ()
    n = _slot("count", doc="samples")
    id = _slot("seq", doc="the order answered")
    loss = _slot("a")
    compute_s = _slot("b", doc="seconds the learner spent on it")
    version = property(lambda m: int(m.arrays["meta"][0]), doc="weights version it used")
    has_grad = property(lambda m: bool(m.arrays["meta"][1]), doc="a gradient follows")
    td_abs = property(lambda m: np.array(m.arrays["td_abs"]), doc="|td| per sample (a copy)")
    max_weight = property(
        lambda m: float(m.arrays["max_weight"][0]),
        doc="its shard's max importance weight when it sampled the batch (0: a relayed batch)",
    )

    def grad(self) -> np.ndarray | None:
        """The flat float32 gradient (a copy: aligned), or None."""
        return np.frombuffer(self.arrays["body"].tobytes(), np.float32) if self.has_grad else None


#: the view `Wire.unpack` returns for each kind
VIEWS: dict[Tag, type[Message]] = {
    Tag.EXPERIENCE: Experience,
    Tag.CREDIT: Credit,
    Tag.WEIGHTS: Weights,
    Tag.KEYFRAME: Keyframe,
    Tag.FORWARD: Forward,
    Tag.BATCH: Batch,
    Tag.PRIORITIES: Priorities,
    Tag.STATS: Stats,
    Tag.STOP: Stop,
    Tag.DONE: Done,
    Tag.CHECKPOINT: Checkpoint,
    Tag.ORDER: Order,
    Tag.SHARD: Shard,
    Tag.GRAD: Grad,
}


def _header(kind: Tag, count: int = 0, seq: int = 0, a: float = 0.0, b: float = 0.0) -> np.ndarray:
    h = np.zeros(1, HEADER)
    h[0] = (MAGIC, int(kind), VERSION, count, seq, a, b)
    return h


def pack(
    kind: Tag,
    arrays: Sequence[ArrayLike] = (),
    count: int = 0,
    seq: int = 0,
    a: float = 0.0,
    b: float = 0.0,
) -> np.ndarray:
    """Header + arrays -> one uint8 buffer (one copy)."""
    parts = [_header(kind, count, seq, a, b).view(np.uint8)]
    parts += [np.ascontiguousarray(x).view(np.uint8).reshape(-1) for x in arrays]
    return np.concatenate(parts) if len(parts) > 1 else parts[0].copy()


#: a message's size and its arrays: (name, (dtype, shape or None), first byte, end or None)
_Layout = tuple[int, list[tuple[str, tuple[np.dtype, Any], int, Any]]]


class Wire:
    """Packs and unpacks every kind for one run (the transition dtype and parameter count; for
    image runs the frame shape; whether FORWARD and BATCH are compressed)."""

    def __init__(
        self,
        record_dtype: np.dtype,
        n_params: int,
        frame_shape: Sequence[int] | None = None,
        compress: bool = False,
    ) -> None:
        self.record = np.dtype(record_dtype)
        self.n_params = int(n_params)
        self.frame_shape = tuple(frame_shape) if frame_shape is not None else None
        self.frame = np.dtype((np.uint8, self.frame_shape)) if frame_shape is not None else None
        self.compress = bool(compress)
        self.last_raw_nbytes = 0  # uncompressed size of the last FORWARD / BATCH packed
        self._zc: Any = None  # zstandard's codecs, made on first use (an optional extra)
        self._zd: Any = None
        # (kind, count, b, nframes) -> (need, [(name, view, lo, hi)])
        self._layouts: dict[tuple[Tag, int, float, int], _Layout] = {}
        if compress:
            self._codecs()

    def _codecs(self) -> tuple[Any, Any]:
        if self._zc is None:
            try:
                import zstandard
            except ImportError:
                raise RuntimeError(
                    'compressed messages need zstandard: pip install -e ".[images]"'
                ) from None
            self._zc = zstandard.ZstdCompressor(level=ZSTD_LEVEL)
            self._zd = zstandard.ZstdDecompressor()
        return self._zc, self._zd

    def _spec(
        self, kind: Tag, count: int, b: float, nframes: int = 0
    ) -> list[tuple[str, np.dtype, int]]:
        spec = self._spec_records(kind, count, b)
        if self.frame is not None and kind in RECORD_KINDS:
            spec = [("nframes", np.dtype("<i8"), 1)] + spec + [("frames", self.frame, nframes)]
        return spec

    def _spec_records(self, kind: Tag, count: int, b: float) -> list[tuple[str, np.dtype, int]]:
        f8, f4, i8, rec = np.dtype("<f8"), np.dtype("<f4"), np.dtype("<i8"), self.record
        if kind == Tag.EXPERIENCE:
            return [
                ("acting", i8, 1),
                ("returns", f8, int(b)),
                ("td_abs", f4, count),
                ("records", rec, count),
            ]
        if kind == Tag.FORWARD:
            keep = [("keep", np.dtype("u1"), count)] if b else []
            return [("td_abs", f4, count), ("records", rec, count), *keep]
        if kind == Tag.BATCH:
            return [
                ("window", i8, 1),
                ("indices", i8, count),
                ("generations", i8, count),
                ("weights", f4, count),
                ("priorities", f4, count),
                ("records", rec, count),
            ]
        if kind == Tag.PRIORITIES:
            return [
                ("timing", f8, 2),
                ("indices", i8, count),
                ("generations", i8, count),
                ("td_abs", f4, count),
            ]
        if kind == Tag.WEIGHTS:
            return self._spec_weights(count)
        if kind == Tag.STATS:
            return [("returns", f8, count), ("acting", i8, -1)]
        if kind in (Tag.ORDER, Tag.GRAD):
            meta: list[tuple[str, np.dtype, int]] = [("meta", i8, 3 if kind == Tag.ORDER else 2)]
            if kind == Tag.GRAD:
                meta += [("max_weight", f8, 1), ("td_abs", f4, count)]
            return meta + [("body", np.dtype("u1"), -1)]
        if kind == Tag.SHARD:
            return [("body", np.dtype("u1"), -1)]
        return []

    def _spec_weights(self, encoding: int) -> list[tuple[str, np.dtype, int]]:
        p = self.n_params
        if encoding == FULL:
            return [("params", np.dtype("<f4"), p)]
        if encoding == BF16:
            return [("params", np.dtype("<u2"), p)]
        if encoding == DELTA:
            return [
                ("meta", np.dtype("<i8"), 2),
                ("scales", np.dtype("<f4"), n_blocks(p)),
                ("q", np.dtype("i1"), p),
            ]
        return [("unknown_encoding", np.dtype("u1"), -1)]  # never matches: a WireError

    def _layout(self, kind: Tag, count: int, b: float, nframes: int) -> _Layout:
        """Byte ranges of a message's arrays, cached: a run sees few distinct shapes, and
        building them per message was a third of `unpack`."""
        # b sizes only EXPERIENCE (returns) and FORWARD (keep or not); in other kinds it is a
        # value that changes per message
        key = (kind, count, b if kind in (Tag.EXPERIENCE, Tag.FORWARD) else 0.0, nframes)
        lay = self._layouts.get(key)
        if lay is None:
            parts: list[tuple[str, tuple[np.dtype, Any], int, Any]] = []
            off = HEADER.itemsize
            for name, dt, n in self._spec(kind, count, b, nframes):
                if n == -1:  # the variable tail: whatever follows (need is then a minimum)
                    parts.append((name, (dt, None), off, None))
                    continue
                size = dt.itemsize * n
                view = (dt.base, (n,) + dt.shape) if dt.subdtype is not None else (dt, None)
                parts.append((name, view, off, off + size))
                off += size
            lay = (off, parts)
            if len(self._layouts) < 4096:
                self._layouts[key] = lay
        return lay

    def unpack(
        self, buf: np.ndarray, tag: int, source: str = "?", rank: int = -1, t: float = 0.0
    ) -> Message:
        """Check and view a received buffer (no copy) as its kind's view (`VIEWS`); ``rank``
        and ``t`` are stored with it (`Message`).  WireError names the sender and the kind."""
        if buf.nbytes < HEADER.itemsize:
            raise WireError(
                f"message with tag {tag} from {source}: {buf.nbytes} bytes is "
                "shorter than the 40-byte header"
            )
        magic, raw_kind, version, count, seq, a, b = buf[: HEADER.itemsize].view(HEADER)[0].item()
        kind = _TAGS.get(raw_kind & KIND_MASK)
        if (
            magic != MAGIC
            or version != VERSION
            or kind is None
            or kind != tag
            or raw_kind & ~(KIND_MASK | FLAG_ZSTD)
        ):
            where = f"message with tag {tag} from {source}"
            if magic != MAGIC:
                raise WireError(f"{where}: bad magic {magic:#x} (not an mpirl message)")
            if version != VERSION:
                raise WireError(
                    f"{where}: wire version {version}, this rank speaks "
                    f"{VERSION}; run the same mpirl version on every rank"
                )
            if kind is None:
                raise WireError(f"{where}: unknown kind {raw_kind}")
            if raw_kind & ~(KIND_MASK | FLAG_ZSTD):
                raise WireError(f"{where}: unknown flags {raw_kind & ~KIND_MASK:#x}")
            raise WireError(f"{where}: header says {kind.name}, tag says {tag}")
        raw_nbytes, received = 0, buf
        if raw_kind & FLAG_ZSTD:
            buf = self._decompress(buf, f"message with tag {tag} from {source}")
            raw_nbytes = buf.nbytes
        if count < 0 or b < 0 or b > 1e9:
            raise WireError(
                f"message with tag {tag} from {source}: bad counts (count={count}, b={b})"
            )
        nframes = 0
        if self.frame is not None and kind in RECORD_KINDS:
            if buf.nbytes < HEADER.itemsize + 8:
                raise WireError(
                    f"message with tag {tag} from {source}: {kind.name} of an image "
                    "run has no nframes field"
                )
            nframes = int(buf[HEADER.itemsize : HEADER.itemsize + 8].view("<i8")[0])
            if nframes < 0 or nframes > 1e9:
                raise WireError(f"message with tag {tag} from {source}: bad nframes={nframes}")
        need, parts = self._layout(kind, count, b, nframes)
        tail = bool(parts) and parts[-1][3] is None
        if need != buf.nbytes and not (tail and buf.nbytes >= need):
            raise WireError(
                f"message with tag {tag} from {source}: {kind.name} with "
                f"count={count} must be {need} bytes, got {buf.nbytes} (mismatched "
                "observation shape or version?)"
            )
        arrays = {}
        for name, (dt, shape), lo, hi in parts:
            part = buf[lo:hi].view(dt)  # (hi None: the tail, to the end)
            arrays[name] = part if shape is None else part.reshape(shape)
        return VIEWS[kind](kind, count, seq, a, b, arrays, raw_nbytes, received, rank, t)

    # ---- compression (FLAG_ZSTD) ---------------------------------------------------------------
    def _maybe_compress(self, buf: np.ndarray) -> np.ndarray:
        """Compress a packed FORWARD / BATCH when this run compresses (else ``buf`` as is)."""
        self.last_raw_nbytes = buf.nbytes
        if not self.compress:
            return buf
        return compress(buf, self._codecs()[0])

    def _decompress(self, buf: np.ndarray, where: str) -> np.ndarray:
        hsz = HEADER.itemsize
        if buf.nbytes < hsz + 8:
            raise WireError(
                f"{where}: compressed message of {buf.nbytes} bytes has no raw_nbytes field"
            )
        raw = int(buf[hsz : hsz + 8].view("<i8")[0])
        if raw < 0 or raw > 1 << 40:
            raise WireError(f"{where}: bad raw_nbytes={raw}")
        zd = self._codecs()[1]
        import zstandard  # importable: _codecs made zd

        try:
            body = zd.decompress(buf[hsz + 8 :].data, max_output_size=raw)
        except zstandard.ZstdError as e:
            raise WireError(f"{where}: compressed body does not decompress ({e})") from None
        if len(body) != raw:
            raise WireError(f"{where}: decompressed to {len(body)} bytes, header says {raw}")
        out = np.empty(hsz + raw, np.uint8)
        out[:hsz] = buf[:hsz]
        out[:hsz].view(HEADER)["kind"] &= KIND_MASK
        out[hsz:] = np.frombuffer(body, np.uint8)
        return out

    def _frames_arrays(
        self, frames: np.ndarray | None, n_records: int
    ) -> tuple[list[np.ndarray], list[np.ndarray]]:
        if self.frame is None:
            if frames is not None:
                raise ValueError("frames given to a Wire without frame_shape")
            return [], []
        assert self.frame_shape is not None  # set together with self.frame
        if frames is None:
            frames = np.zeros((0,) + self.frame_shape, np.uint8)
        frames = np.ascontiguousarray(frames, np.uint8)
        if frames.shape[1:] != self.frame_shape:
            raise ValueError(
                f"frames of shape {frames.shape[1:]}, this run's frames are {self.frame_shape}"
            )
        return [np.array([len(frames)], "<i8")], [frames]

    # ---- packers, one per kind (documented in the module docstring) --------------------------
    def experience(
        self,
        records: np.ndarray,
        td_abs: ArrayLike,
        returns: ArrayLike,
        env_steps: int,
        seq: int,
        frames: np.ndarray | None = None,
        acting: int = 0,
    ) -> np.ndarray:
        """``acting``: the learner updates of the weights the actor acted with."""
        returns = np.asarray(returns, "<f8")
        pre, post = self._frames_arrays(frames, len(records))
        return pack(
            Tag.EXPERIENCE,
            pre + [np.array([acting], "<i8"), returns, np.asarray(td_abs, "<f4"), records] + post,
            count=len(records),
            seq=seq,
            a=env_steps,
            b=len(returns),
        )

    def forward(
        self,
        records: np.ndarray,
        td_abs: ArrayLike,
        seq: int,
        frames: np.ndarray | None = None,
        keep: ArrayLike | None = None,
        produced: int = 0,
    ) -> np.ndarray:
        """``keep``: each transition's probability of being forwarded (None: all 1, not sent);
        ``produced``: the transitions the site produced that the message stands for (0: its
        own)."""
        pre, post = self._frames_arrays(frames, len(records))
        kept = [] if keep is None else [keep_code(np.asarray(keep, np.float32))]
        return self._maybe_compress(
            pack(
                Tag.FORWARD,
                pre + [np.asarray(td_abs, "<f4"), records, *kept] + post,
                count=len(records),
                seq=seq,
                a=produced,
                b=float(keep is not None),
            )
        )

    def batch(
        self,
        sample: Sample,
        batch_id: int,
        t_send: float,
        max_weight: float = 1.0,
        window: int = 0,
    ) -> np.ndarray:
        """A sampled batch (`mpirl.replay.Sample`, with its frame table for image runs)."""
        pre, post = self._frames_arrays(sample.frames, len(sample.indices))
        return self._maybe_compress(
            pack(
                Tag.BATCH,
                pre
                + [
                    np.array([window], "<i8"),
                    np.asarray(sample.indices, "<i8"),
                    np.asarray(sample.generations, "<i8"),
                    np.asarray(sample.weights, "<f4"),
                    np.asarray(sample.priorities, "<f4"),
                    sample.records,
                ]
                + post,
                count=len(sample.indices),
                seq=batch_id,
                a=t_send,
                b=min(float(max_weight), MAX_WEIGHT),
            )
        )

    def priorities(
        self,
        indices: np.ndarray,
        generations: np.ndarray,
        td_abs: np.ndarray,
        batch_id: int,
        t_echo: float,
        hold: float = 0.0,
        step: float = 0.0,
        updates: int = 0,
    ) -> np.ndarray:
        """One per trained batch: written straight into its cached layout (the generic `pack`
        builds and concatenates five arrays; this is the learner's one packer per update)."""
        n = len(indices)
        need, parts = self._layout(Tag.PRIORITIES, n, 0.0, 0)
        out = np.empty(need, np.uint8)
        out[: HEADER.itemsize].view(HEADER)[0] = (
            MAGIC,
            int(Tag.PRIORITIES),
            VERSION,
            n,
            batch_id,
            t_echo,
            updates,
        )
        for (_, (dt, _), lo, hi), x in zip(
            parts, ((hold, step), indices, generations, td_abs), strict=True
        ):
            out[lo:hi].view(dt)[:] = x
        return out

    def weights(self, params: np.ndarray, version: int, updates: int) -> np.ndarray:
        """Full float32 weights (encoding 0)."""
        return pack(Tag.WEIGHTS, [np.asarray(params, "<f4")], seq=version, a=updates)

    def weights_bf16(self, bits: np.ndarray, version: int, updates: int) -> np.ndarray:
        """bfloat16 weights (encoding 1), ``bits`` from `mpirl.transport.weight_codec.to_bf16`."""
        return pack(Tag.WEIGHTS, [np.asarray(bits, "<u2")], count=1, seq=version, a=updates)

    def weights_delta(
        self,
        scales: np.ndarray,
        q: np.ndarray,
        base_version: int,
        crc: int,
        version: int,
        updates: int,
    ) -> np.ndarray:
        """A quantized change from version ``base_version`` (encoding 2), zstd-compressed."""
        raw = pack(
            Tag.WEIGHTS,
            [np.array([base_version, crc], "<i8"), np.asarray(scales, "<f4"), np.asarray(q, "i1")],
            count=2,
            seq=version,
            a=updates,
        )
        return compress(raw, self._codecs()[0])

    @staticmethod
    def order(
        order_id: int,
        n: int,
        beta: float,
        scale: float = 1.0,
        weights: tuple[np.ndarray, np.ndarray] | None = None,
        version: int = -1,
        batch_buf: np.ndarray | None = None,
        how: int = SUBMIT,
    ) -> np.ndarray:
        """A learner-group ORDER: ``weights`` (online, target) of ``version`` when the learner's
        copy is older, ``batch_buf`` a buffer's BATCH relayed as it came (else: sample your
        shard); ``how`` the update: ALLREDUCE, SUBMIT or RESYNC."""
        body = [] if weights is None else [np.asarray(w, "<f4") for w in weights]
        if batch_buf is not None:
            body.append(batch_buf)
        carried = version if weights is not None else -1
        meta = np.array([carried, batch_buf is not None, how], "<i8")
        return pack(Tag.ORDER, [meta, *body], count=n, seq=order_id, a=beta, b=scale)

    @staticmethod
    def shard(forward_buf: np.ndarray) -> np.ndarray:
        return pack(Tag.SHARD, [forward_buf])

    @staticmethod
    def grad(
        order_id: int,
        version: int,
        td_abs: np.ndarray,
        loss: float,
        compute_s: float,
        grad: np.ndarray | None = None,
        max_weight: float = 0.0,
    ) -> np.ndarray:
        """``max_weight``: the shard's max importance weight when it sampled the batch (the
        lead puts every shard's weights on one scale with it)."""
        meta = np.array([version, grad is not None], "<i8")
        arrays = [meta, np.array([max_weight], "<f8"), np.asarray(td_abs, "<f4")]
        arrays += [] if grad is None else [grad]
        return pack(Tag.GRAD, arrays, count=len(td_abs), seq=order_id, a=loss, b=compute_s)

    @staticmethod
    def keyframe(version: int) -> np.ndarray:
        return pack(Tag.KEYFRAME, seq=version)

    @staticmethod
    def credit(tokens: int, samples: float = 0.0) -> np.ndarray:
        return pack(Tag.CREDIT, count=tokens, a=samples)

    @staticmethod
    def stats(
        returns: ArrayLike,
        env_steps: int,
        episodes: int,
        weights_updates: int = 0,
        acting: dict[int, int] | None = None,
    ) -> np.ndarray:
        """``acting``: site rank -> learner updates of the weights that actor acts with."""
        returns = np.asarray(returns, "<f8")
        pairs = np.array(sorted((acting or {}).items()), "<i8").reshape(-1)
        return pack(
            Tag.STATS,
            [returns, pairs],
            count=len(returns),
            seq=weights_updates,
            a=env_steps,
            b=episodes,
        )

    @staticmethod
    def stop(checkpoint: int = -1) -> np.ndarray:
        return pack(Tag.STOP, seq=checkpoint)

    @staticmethod
    def checkpoint(ckpt_id: int, env_steps: int = 0) -> np.ndarray:
        return pack(Tag.CHECKPOINT, seq=ckpt_id, a=env_steps)

    @staticmethod
    def done(env_steps: int, episodes: int) -> np.ndarray:
        return pack(Tag.DONE, a=env_steps, b=episodes)


def compress(buf: np.ndarray, compressor: Any) -> np.ndarray:
    """A packed message -> the same message with its body zstd-compressed (FLAG_ZSTD)."""
    hsz = HEADER.itemsize
    body = compressor.compress(buf[hsz:].data)
    out = np.empty(hsz + 8 + len(body), np.uint8)
    out[:hsz] = buf[:hsz]
    out[:hsz].view(HEADER)["kind"] |= FLAG_ZSTD
    out[hsz : hsz + 8].view("<i8")[0] = buf.nbytes - hsz
    out[hsz + 8 :] = np.frombuffer(body, np.uint8)
    return out
