"""``--replay-at buffer`` (the paper's proposed design): the edge buffer holds the prioritized
replay memory and ships only sampled batches over the long-haul link; the learner trains them in
weighted fair order across sites and sends each batch's new priorities back.

`SiteMemory` is the buffer's side: it keeps ``inflight`` batches (with importance weights) in
flight, applies the priority updates that come back generation-checked (an update for a slot
that was overwritten meanwhile is dropped and counted), and with the rate limiter paces the
actors so the learner samples ``replay_ratio`` transitions per inserted one.

`LinkBatches` is the learner's side: each site's batches wait in a queue; the next one comes
from the site furthest behind its ``--site-weights`` share, its importance weights rescaled so
that the largest weight over every site's memory is 1 (docs/design.md).
"""

from __future__ import annotations

import time
from collections import deque
from typing import TYPE_CHECKING, Any

import numpy as np

from mpirl.agent.gba import held_at_once
from mpirl.replay.build import beta_at, make_replay, replay_footprint
from mpirl.replay.rate_limiter import RateLimiter
from mpirl.roles.placements.common import Drawn, Handlers, LearnerContext, Site, SiteContext
from mpirl.run.checkpoint import memory_state, restore_memory
from mpirl.transport.window import InflightWindow
from mpirl.transport.wire import Tag

if TYPE_CHECKING:
    from mpirl.logs.runlog import Stream
    from mpirl.replay.frames import FrameReplay
    from mpirl.replay.memory import PrioritizedReplay
    from mpirl.roles.learner_rows import Arrivals, HeldRows
    from mpirl.run.config import Config
    from mpirl.transport.link import LinkEnd
    from mpirl.transport.wire import Batch, Experience, Priorities, Wire


class SiteMemory:
    """The buffer's prioritized replay memory and the batches it has in flight."""

    def __init__(
        self,
        cfg: Config,
        memory: PrioritizedReplay | FrameReplay,
        link: LinkEnd,
        wire: Wire,
        window: InflightWindow,
        batches: Stream,
        on_raw: Any,
    ) -> None:
        """``batches``: the /batches stream; ``on_raw(out)`` counts what compression saved."""
        self.cfg, self.memory, self.link, self.wire, self.window = cfg, memory, link, wire, window
        self.batches, self.on_raw = batches, on_raw
        self.limiter = RateLimiter(cfg.replay_ratio, cfg.learning_starts)
        self.handlers: Handlers = {Tag.PRIORITIES: self.on_priorities}
        # batch id -> (send time, queue wait, serialization time on the modelled link)
        self.inflight: dict[int, tuple[float, float, float]] = {}
        self.rtts: list[float] = []
        self.learner_updates = 0  # as the last WEIGHTS / PRIORITIES said: decides beta
        self.weights_seen = False  # batches go after the first weights
        self.batch_id = self.stale_dropped = self.too_stale = 0
        self.prio_received = self.prio_applied = 0
        self.prio_moved = 0.0

    def add(self, m: Experience) -> None:
        self.memory.add(m.records, m.td_abs, m.frames)
        self.limiter.inserted += m.n

    def may_grant(self) -> bool:
        """Tokens to the actors only while the learner keeps up (the replay ratio)."""
        return self.limiter.may_insert()

    def weights_arrived(self, updates: int) -> None:
        self.weights_seen = True
        self.learner_updates = max(self.learner_updates, updates)

    def on_priorities(self, m: Priorities) -> None:
        """A batch's new priorities: the window's round trip, then the memory (generation-checked,
        never on an overwritten slot; older than --max-staleness batches: dropped)."""
        now = m.t
        self.learner_updates = max(self.learner_updates, m.updates)
        sent = self.inflight.pop(m.batch_id, None)
        hold, step = m.timing
        if sent is not None:
            self.rtts.append(now - sent[0])
            self.window.observe(now - sent[0], float(hold), sent[1], float(step), sent[2])
        self.prio_received += m.n
        if self.cfg.max_staleness and self.batch_id - 1 - m.batch_id > self.cfg.max_staleness:
            self.too_stale += m.n  # too old to trust: GBA's staleness bound
            return
        memory = self.memory
        total = memory.total_priority()
        dropped = memory.update(m.indices, m.generations, m.td_abs)
        self.stale_dropped += dropped
        self.prio_applied += m.n - dropped
        self.prio_moved += abs(memory.total_priority() - total)

    def ship(self, now: float, stopping: bool) -> bool:
        """Sampled batches up to the window, after the first weights (they say how many updates
        the learner has made: beta is the learner's, never this site's); the rate limiter holds
        sampling too (actors are throttled in the other direction, so one side can always
        move)."""
        cfg, memory = self.cfg, self.memory
        if stopping or not self.weights_seen:
            return False
        beta = beta_at(cfg, self.learner_updates)
        memory.beta = beta
        did = False
        while (
            len(self.inflight) < self.window.size
            and len(memory) >= max(cfg.learning_starts, 1)
            and self.limiter.may_sample()
        ):
            sample = memory.sample(cfg.batch_size)
            max_w = memory.max_weight()
            out = self.wire.batch(
                sample, self.batch_id, now, max_weight=max_w, window=self.window.size
            )
            wait = self.link.post(out, now=now)
            self.on_raw(out)
            self.batches.append(
                batch=self.batch_id,
                priority_mean=float(sample.priorities.mean()),
                size=len(memory),
                beta=beta,
                max_weight=max_w,
            )
            tx = out.nbytes * 8 / self.link.profile.rate_bps  # 0 on a real link
            self.inflight[self.batch_id] = (now, wait, tx)
            self.batch_id += 1
            self.limiter.sampled += cfg.batch_size
            did = True
        return did

    def drained(self) -> bool:
        return True  # nothing waits here to be handed over at the stop

    def counters(self) -> dict[str, float]:
        return {
            "inserted": self.limiter.inserted,
            "sampled": self.limiter.sampled,
            "batch_id": self.batch_id,
            "stale_dropped": self.stale_dropped,
            "too_stale": self.too_stale,
            "prio_received": self.prio_received,
            "prio_applied": self.prio_applied,
            "prio_moved": self.prio_moved,
        }

    def save(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        arrays, replay = memory_state(self.memory)
        return {**self.counters(), "replay": replay}, arrays

    def restore(self, meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
        self.limiter.inserted, self.limiter.sampled = meta["inserted"], meta["sampled"]
        self.batch_id = meta["batch_id"]
        self.stale_dropped, self.too_stale = meta["stale_dropped"], meta["too_stale"]
        self.prio_received = meta.get("prio_received", 0)
        self.prio_applied = meta.get("prio_applied", 0)
        self.prio_moved = meta.get("prio_moved", 0.0)
        restore_memory(self.memory, arrays, meta["replay"])

    def site_row(self) -> dict[str, float]:
        window, rtts = self.window, self.rtts
        row = {
            "replay_size": len(self.memory),
            "inflight": len(self.inflight),
            "window": window.size,
            "rtt_s": float(np.mean(rtts)) if rtts else np.nan,
            "rtt_net_s": window.rtt_net if window.rtt_net is not None else np.nan,
            "step_s": window.step if window.step is not None else np.nan,
        }
        rtts.clear()
        return row


class LinkBatches:
    """The learner's batches: every site's BATCH messages, trained in weighted fair order; each
    batch's |td| goes back to its site as PRIORITIES."""

    def __init__(
        self,
        sites: dict[int, Site],
        wire: Wire,
        rows: HeldRows,
        arrivals: Arrivals,
        group_size: int = 1,
    ) -> None:
        self.sites, self.wire, self.rows, self.arrivals = sites, wire, rows, arrivals
        self.k = group_size  # K learners serve K batches at a time
        self.ready: dict[int, deque[Batch]] = {b: deque() for b in sites}
        self.max_weight = {b: 0.0 for b in sites}  # each memory's max weight, of its last batch
        self.handlers: Handlers = {Tag.BATCH: self.on_batch}
        self.inserted = 0  # (nothing is inserted at the learner)
        self.sampled = 0  # transitions trained
        self.step_s: float | None = None  # smoothed seconds per update, sent with priorities
        self.accepting = True

    def on_batch(self, m: Batch) -> None:
        if self.accepting:
            self.ready[m.rank].append(m)

    def start(self, now: float) -> None:
        pass

    def stop(self) -> None:
        """At the stop: batches that arrive from now on are not trained."""
        self.accepting = False

    def draw(self, beta: float) -> Drawn | None:
        """The next site's batch in weighted fair order, its weights rescaled to the global
        largest weight (beta is the buffer's: it sampled the batch)."""
        waiting = [self.sites[b] for b, q in self.ready.items() if q]
        if not waiting:
            return None
        site = min(waiting, key=Site.share)  # weighted fair queueing
        m = self.ready[site.rank].popleft()
        site.served += 1
        self.max_weight[site.rank] = m.max_weight  # the normaliser this batch was sampled with
        top = max(self.max_weight.values())
        scale = float(m.max_weight / top) if m.max_weight < top else 1.0
        weights = m.weights if scale == 1.0 else m.weights * np.float32(scale)
        return Drawn(
            m.records, weights, m.frames, site=site, batch=m, scale=scale, drawn_as=m.priorities
        )

    def for_member(self, member: int, shard_len: int) -> Drawn | None:
        """A batch for another learner of the group: relayed as it came."""
        return self.draw(0.0)

    def members_ready(self, shard_lens: list[int]) -> bool:
        return sum(len(q) for q in self.ready.values()) >= len(shard_lens)

    def trained(self, drawn: Drawn, td: np.ndarray, spent: float, updates: int) -> None:
        """A site's batch was trained (here, or by another learner, ``spent`` seconds): its
        priorities back to its buffer, the transfer's row."""
        site, m = drawn.site, drawn.batch
        assert site is not None and m is not None
        self.sampled += m.n
        if site.done:
            return
        spent /= self.k
        self.step_s = spent if self.step_s is None else 0.9 * self.step_s + 0.1 * spent
        site.link.post(
            self.wire.priorities(
                m.indices,
                m.generations,
                td,
                m.batch_id,
                m.t_send,
                hold=time.monotonic() - m.t,
                step=self.step_s,
                updates=updates,
            ),
        )
        self.rows.batch(
            site.index,
            updates,
            m.n,
            m.nbytes,
            m.raw_nbytes or m.nbytes,
            m.window,
            m.priorities,
            self.arrivals.of_batch(td),
        )

    def grant_tokens(self, now: float, stopping: bool) -> None:
        pass  # the buffers pace themselves with their window and the rate limiter

    def delivered(self) -> int | None:
        return None  # experiences stay at the edge

    def save(self) -> tuple[dict[str, Any], dict[str, np.ndarray] | None]:
        return {"inserted": self.inserted, "sampled": self.sampled}, None

    def restore(self, meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
        self.inserted, self.sampled = meta["inserted"], meta["sampled"]


# ---- what the wiring builds (mpirl.roles.placements) ---------------------------------------------
def site_side(ctx: SiteContext) -> SiteMemory:
    cfg = ctx.cfg
    memory = make_replay(cfg, ctx.spec, ctx.wire.record, seed=ctx.seed)
    # one on the way beyond what the learner group trains on at once (its lead and the orders
    # it relays to the other learners)
    window = InflightWindow(
        cfg.inflight_fixed, floor=held_at_once(cfg.learners, cfg.learner_sync) + 1
    )
    return SiteMemory(cfg, memory, ctx.link, ctx.wire, window, ctx.streams["batches"], ctx.on_raw)


def batch_source(ctx: LearnerContext) -> LinkBatches:
    return LinkBatches(ctx.sites, ctx.wire, ctx.rows, ctx.arrivals, ctx.group.k)


def worker_shard(cfg: Config, spec: Any, record: Any, k: int, index: int, seed: int) -> None:
    return None  # the memory is at the edge


def edge_memory_bytes(cfg: Config, spec: Any) -> int:
    return replay_footprint(cfg, spec)
