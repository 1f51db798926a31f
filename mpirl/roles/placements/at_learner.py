"""``--replay-at learner`` (the existing, Ape-X style design): the edge buffer forwards every
experience over the long-haul link and the learner holds the prioritized replay memory.

`SiteForwarding` is the buffer's side: experiences wait in a bounded `ForwardQueue` and go in
chunks of ``forward_chunk`` against tokens the learner grants (``forward_credits`` in flight).
When the queue is full the buffer stops granting tokens to its actors (backpressure) or drops the
oldest (``--forward-overflow drop-oldest``), so memory stays bounded whatever the link does.

`LocalMemory` is the learner's side: forwarded experiences go into its memory (or, with
``--learners K``, round-robin into the group's shards); it samples its own batches, and gives
forward tokens back, the site furthest behind its share first, while the rate limiter says the
learner keeps up.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from mpirl.agent.frames import compact, concat
from mpirl.replay.build import make_replay, shard_config
from mpirl.replay.rate_limiter import RateLimiter
from mpirl.roles.learner_rows import small_mean, spread, td_units
from mpirl.roles.placements.common import Drawn, Handlers, LearnerContext, Site, SiteContext
from mpirl.run.checkpoint import memory_state, restore_memory
from mpirl.transport.wire import Tag

if TYPE_CHECKING:
    from mpirl.agent.envs import EnvSpec
    from mpirl.logs.runlog import Stream
    from mpirl.replay.frames import FrameReplay
    from mpirl.replay.memory import PrioritizedReplay
    from mpirl.roles.learner_rows import Arrivals
    from mpirl.run.config import Config
    from mpirl.transport.link import LinkEnd
    from mpirl.transport.wire import Credit, Experience, Forward, Wire


#: a queued group: records, |td|, frame table (image runs) and each one's probability of
#: being forwarded (``--replay-at thinned``; None: all 1)
Group = tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray | None]


class ForwardQueue:
    """Experiences received, not yet forwarded: groups of (records, |td|, frame table or None,
    keep probabilities or None), at most ``limit`` transitions when ``drop_oldest``."""

    def __init__(self, wire: Wire, spec: EnvSpec, limit: int, drop_oldest: bool) -> None:
        self.wire, self.spec, self.limit, self.drop_oldest = wire, spec, limit, drop_oldest
        self.groups: deque[Group] = deque()
        self.len = 0
        self.dropped = 0  # transitions dropped by drop-oldest

    def add(
        self,
        records: np.ndarray,
        td_abs: np.ndarray,
        frames: np.ndarray | None = None,
        keep: np.ndarray | None = None,
    ) -> None:
        self.groups.append((records, td_abs, frames, keep))
        self.len += len(records)
        while self.len > self.limit and self.drop_oldest:
            old = self.groups.popleft()[0]
            self.len -= len(old)
            self.dropped += len(old)

    @property
    def full(self) -> bool:
        return self.len >= self.limit

    def take(self, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """Up to ``n`` transitions from the front, as one message's records, |td| and (image
        runs) one frame table holding only the frames they refer to."""
        return self.take_kept(n)[:3]

    def take_kept(self, n: int) -> Group:
        """`take`, with the transitions' keep probabilities (None when all of them are 1)."""
        recs: list[np.ndarray] = []
        tds: list[np.ndarray] = []
        tables: list[np.ndarray | None] = []
        keeps: list[np.ndarray | None] = []
        k = 0
        while self.groups and k < n:
            r, t, f, p = self.groups.popleft()
            take = min(len(r), n - k)
            recs.append(r[:take])
            tds.append(t[:take])
            tables.append(f)
            keeps.append(None if p is None else p[:take])
            if take < len(r):
                self.groups.appendleft((r[take:], t[take:], f, None if p is None else p[take:]))
            k += take
        self.len -= k
        if self.spec.image:
            # an image run's groups all have their frame table
            frames = cast("list[np.ndarray]", tables)
            records, table = compact(*concat(zip(recs, frames, strict=True)))
        else:
            records, table = np.concatenate(recs), None
        return records, np.concatenate(tds), table, _joined(keeps, recs)

    def state(self) -> dict[str, np.ndarray]:
        """The queue as checkpoint arrays (one frame table for the whole queue)."""
        arrays: dict[str, np.ndarray] = {}
        image = self.spec.image
        if image and self.groups:
            arrays["forward_records"], arrays["forward_frames"] = concat(
                (r, cast("np.ndarray", f))
                for r, _, f, _ in self.groups  # (image: a table each)
            )
        else:
            arrays["forward_records"] = (
                np.concatenate([r for r, _, _, _ in self.groups])
                if self.groups
                else np.zeros(0, self.wire.record)
            )
            if image:
                assert self.spec.frame_shape is not None  # set for image envs
                arrays["forward_frames"] = np.zeros((0,) + self.spec.frame_shape, np.uint8)
        arrays["forward_td"] = (
            np.concatenate([t for _, t, _, _ in self.groups]).astype(np.float32)
            if self.groups
            else np.zeros(0, np.float32)
        )
        keep = _joined([p for _, _, _, p in self.groups], [r for r, _, _, _ in self.groups])
        if keep is not None:
            arrays["forward_keep"] = keep
        return arrays

    def restore(self, arrays: dict[str, np.ndarray]) -> None:
        if len(arrays["forward_records"]):
            keep = arrays.get("forward_keep")
            self.groups.append(
                (
                    arrays["forward_records"],
                    arrays["forward_td"],
                    arrays.get("forward_frames"),
                    None if keep is None else np.asarray(keep, np.float32),
                )
            )
            self.len = len(arrays["forward_records"])


def _joined(keeps: list[np.ndarray | None], records: list[np.ndarray]) -> np.ndarray | None:
    """The groups' keep probabilities as one float32 array (1 for a group without), or None
    when no group has any."""
    if all(p is None for p in keeps):
        return None
    return np.concatenate(
        [
            np.ones(len(r), np.float32) if p is None else p
            for p, r in zip(keeps, records, strict=True)
        ]
    ).astype(np.float32, copy=False)


class SiteForwarding:
    """The buffer forwards every experience: a chunk per token while a full chunk waits."""

    def __init__(
        self, cfg: Config, spec: EnvSpec, wire: Wire, link: LinkEnd, on_raw: Callable[..., None]
    ) -> None:
        self.cfg, self.wire, self.link, self.on_raw = cfg, wire, link, on_raw
        self.queue = ForwardQueue(
            wire,
            spec,
            max(cfg.forward_credits * cfg.forward_chunk, 4 * cfg.actor_chunk),
            cfg.forward_overflow == "drop-oldest",
        )
        self.handlers: Handlers = {Tag.CREDIT: self.on_credit}
        self.tokens = 0  # granted by the learner
        self.inserted = self.fwd_seq = self.forwarded = 0

    def add(self, m: Experience) -> None:
        self.queue.add(m.records, m.td_abs, m.frames)
        self.inserted += m.n

    def may_grant(self) -> bool:
        """Backpressure: no tokens to the actors while a full queue blocks."""
        return not (self.queue.full and self.cfg.forward_overflow == "block")

    def weights_arrived(self, updates: int) -> None:
        pass

    def on_credit(self, m: Credit) -> None:
        self.tokens += m.tokens

    def ship(self, now: float, stopping: bool) -> bool:
        """A chunk per token while a full chunk waits (all that is left once stopping)."""
        cfg, q = self.cfg, self.queue
        did = False
        while q.groups and self.tokens > 0 and (q.len >= cfg.forward_chunk or stopping):
            out, n = self.next_message()
            self.forwarded += n
            self.link.post(out, now=now)
            self.on_raw(out)
            self.fwd_seq += 1
            self.tokens -= 1
            did = True
        return did

    def next_message(self) -> tuple[np.ndarray, int]:
        """The next FORWARD from the front of the queue, and its transitions."""
        records, td, table = self.queue.take(self.cfg.forward_chunk)
        return self.wire.forward(records, td, self.fwd_seq, frames=table), len(records)

    def drained(self) -> bool:
        return not self.queue.len

    def counters(self) -> dict[str, float]:
        return {"inserted": self.inserted, "fwd_seq": self.fwd_seq, "forwarded": self.forwarded}

    def save(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        return {**self.counters(), "forward_dropped": self.queue.dropped}, self.queue.state()

    def restore(self, meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
        self.inserted, self.fwd_seq = meta["inserted"], meta["fwd_seq"]
        self.forwarded = meta.get("forwarded", 0)
        self.queue.dropped = meta["forward_dropped"]
        self.queue.restore(arrays)

    def site_row(self) -> dict[str, float]:
        return {"forward_queue": self.queue.len, "forward_dropped": self.queue.dropped}


class LocalMemory:
    """The learner's own prioritized replay memory (with --learners K: its shard), filled by
    the buffers' FORWARD messages."""

    def __init__(
        self,
        cfg: Config,
        memory: PrioritizedReplay | FrameReplay,
        sites: dict[int, Site],
        wire: Wire,
        transfers: Stream,
        arrivals: Arrivals,
        updates: Callable[[], int],
        route: Callable[[Forward], bool],
        shard_starts: int,
    ) -> None:
        """``updates()``: the learner's update count (for the rows); ``route(m)``: True when
        the learner group took the message for another learner's shard; ``shard_starts``:
        the transitions a shard needs before it is sampled."""
        self.cfg, self.memory, self.sites, self.wire = cfg, memory, sites, wire
        self.transfers, self.arrivals, self.updates, self.route = (
            transfers,
            arrivals,
            updates,
            route,
        )
        self.shard_starts = max(shard_starts, 1)
        self.limiter = RateLimiter(cfg.replay_ratio, cfg.learning_starts)
        self.owed = {b: 0 for b in sites}  # forward tokens to give back
        #: each shard's max importance weight (0: this learner's), last known: every shard's
        #: batches are put on the scale of the largest, as the sites' are (docs/design.md)
        self.shard_max: dict[int, float] = {}
        self.handlers: Handlers = {Tag.FORWARD: self.on_forward}

    @property
    def inserted(self) -> int:
        return self.limiter.inserted

    @property
    def sampled(self) -> int:
        return self.limiter.sampled

    def on_forward(self, m: Forward) -> None:
        """Forwarded experiences into the memory here (or a shard elsewhere); a token is owed."""
        site, buf, cfg = self.sites[m.rank], m.buf, self.cfg
        assert buf is not None
        pr = (m.td_abs + cfg.priority_eps) ** cfg.alpha
        self.transfers.append(
            buffer=site.index,
            update=self.updates(),
            kind=int(Tag.FORWARD),
            n=m.n,
            nbytes=buf.nbytes,
            raw_nbytes=m.raw_nbytes or buf.nbytes,
            priority_mean=small_mean(pr),
            priority_td_mean=small_mean(td_units(pr, cfg.alpha)),
            **spread(pr),
            **self.arrivals.stats(self.arrivals.td(m.records, m.frames)),
            window=0,
        )
        if not self.route(m):
            self.insert(m)
        self.limiter.inserted += m.produced  # (m.n, unless the site thinned some out)
        site.served += m.n
        self.owed[m.rank] += 1

    def insert(self, m: Forward) -> None:
        """A FORWARD's transitions into this learner's memory."""
        self.memory.add(m.records, m.td_abs, m.frames)

    def start(self, now: float) -> None:
        for s in self.sites.values():
            s.link.post(self.wire.credit(self.cfg.forward_credits), now=now)

    def stop(self) -> None:
        pass  # what is forwarded until the end is stored (and checkpointed)

    def draw(self, beta: float) -> Drawn | None:
        memory = self.memory
        if len(memory) < self.shard_starts or not self.limiter.may_sample():
            return None
        memory.beta = beta
        s = memory.sample(self.cfg.batch_size)
        self.limiter.sampled += self.cfg.batch_size
        scale = self.scale_of(0, memory.max_weight())
        weights = s.weights if scale == 1.0 else s.weights * np.float32(scale)
        return Drawn(
            s.records, weights, s.frames, s.indices, s.generations, scale=scale,
            drawn_as=s.priorities,
        )  # fmt: skip

    def scale_of(self, shard: int, max_weight: float) -> float:
        """The factor that puts a shard's importance weights (divided by its own max weight)
        on the scale of the largest max weight over every shard: the group's global batch
        weighs its transitions as one memory would."""
        if max_weight > 0:
            self.shard_max[shard] = max_weight
        top = max(self.shard_max.values(), default=0.0)
        mine = self.shard_max.get(shard, top)
        return mine / top if 0 < mine < top else 1.0

    def for_member(self, member: int, shard_len: int) -> Drawn | None:
        """An order for another learner to sample its own shard (counted here), with the scale
        of its shard's weights as its last GRAD reported them."""
        if shard_len < self.shard_starts or not self.limiter.may_sample():
            return None
        self.limiter.sampled += self.cfg.batch_size
        return Drawn(None, member=member, scale=self.scale_of(member, 0.0))

    def members_ready(self, shard_lens: list[int]) -> bool:
        return all(n >= self.shard_starts for n in shard_lens)

    def trained(self, drawn: Drawn, td: np.ndarray, spent: float, updates: int) -> None:
        if drawn.member is not None and drawn.max_weight > 0:  # its shard's latest max weight
            self.shard_max[drawn.member] = drawn.max_weight
        if drawn.indices is not None:  # a batch of this memory (a shard's own: updated there)
            assert drawn.generations is not None  # drawn with the indices
            self.memory.update(drawn.indices, drawn.generations, td)

    def grant_tokens(self, now: float, stopping: bool) -> None:
        """Forward tokens back, the site furthest behind its share first, while the learner
        samples ``replay_ratio`` transitions per insert (all of them once stopping)."""
        for s in sorted(self.sites.values(), key=Site.share):
            owed = self.owed[s.rank]
            if owed and (stopping or self.limiter.may_insert()) and not s.done:
                s.link.post(self.wire.credit(owed), now=now)
                self.owed[s.rank] = 0

    def delivered(self) -> int | None:
        return self.limiter.inserted

    def save(self) -> tuple[dict[str, Any], dict[str, np.ndarray] | None]:
        arrays, replay = memory_state(self.memory)
        return {"inserted": self.inserted, "sampled": self.sampled, "replay": replay}, arrays

    def restore(self, meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
        self.limiter.inserted, self.limiter.sampled = meta["inserted"], meta["sampled"]
        restore_memory(self.memory, arrays, meta["replay"])


# ---- what the wiring builds (mpirl.roles.placements) ---------------------------------------------
def site_side(ctx: SiteContext) -> SiteForwarding:
    return SiteForwarding(ctx.cfg, ctx.spec, ctx.wire, ctx.link, ctx.on_raw)


def batch_source(ctx: LearnerContext) -> LocalMemory:
    cfg, k = ctx.cfg, ctx.group.k
    memory = make_replay(shard_config(cfg, k), ctx.spec, ctx.wire.record, seed=ctx.seed)
    return LocalMemory(
        cfg,
        memory,
        ctx.sites,
        ctx.wire,
        ctx.streams["transfers"],
        ctx.arrivals,
        ctx.updates,
        ctx.group.route,
        math.ceil(cfg.learning_starts / k),
    )


def worker_shard(
    cfg: Config, spec: Any, record: Any, k: int, index: int, seed: int
) -> PrioritizedReplay | FrameReplay:
    """Learner ``index`` of the group's shard of the replay memory."""
    return make_replay(shard_config(cfg, k), spec, record, seed=seed)


def edge_memory_bytes(cfg: Config, spec: Any) -> int:
    return 0  # a forward queue of a few chunks
