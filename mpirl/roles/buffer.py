"""Buffer rank: the edge node that collects its site's experiences and faces the long-haul link.

What it does with the experiences is its placement's side (`mpirl.roles.placements`), handed in
by the wiring: keep them in a prioritized replay memory and ship sampled batches (the memory at
the buffer), or forward every one (the memory at the learner).  The loop is the same.

`Buffer.run` is the loop; each turn is a list of named steps, each a method:

    receive_learner    weights (decoded into the site's cache, relayed to the actors as float32),
                       checkpoint, stop, done, and the placement's kinds: one handler per kind
    receive_actors     experiences, checkpoint acknowledgements, done; at most
                       MAX_ACTOR_MSGS_PER_TURN, so the learner is never starved by a flood
    checkpoint         the site's side of the consistent cut (`mpirl.transport.cut.SiteCut`)
    grant_tokens       token control toward the actors
    send               the placement's traffic toward the learner (sampled batches, or forwarded
                       chunks)
    send_stats         env steps and returns toward the learner
    hand_over          on STOP: the final part, the last stats, DONE
    report, wait       /link and /site rows; yield the core when the turn did nothing
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from mpirl.run import failure
from mpirl.transport.cut import SiteCut
from mpirl.transport.link import PROFILES
from mpirl.transport.waiting import Backoff
from mpirl.transport.weight_codec import FULL, WeightCache
from mpirl.transport.wire import Tag

if TYPE_CHECKING:
    from collections.abc import Callable

    from mpirl.logs.runlog import RunLog, Stream
    from mpirl.roles.placements.common import SiteSide
    from mpirl.run.checkpoint import Checkpointer, Part
    from mpirl.run.config import Config
    from mpirl.transport.inbox import Inbox, SitePort
    from mpirl.transport.link import LinkEnd
    from mpirl.transport.wire import Checkpoint, Done, Experience, Stop, Weights, Wire

LEARNER = 0  # link rank of the learner
MAX_ACTOR_MSGS_PER_TURN = 8
STATS_EVERY_S = 0.25  # seconds between STATS messages toward the learner


#: the buffer's counters: its checkpoint part and its /site rows (with the same names); each
#: placement's side counts its own (`SiteSide.counters`), the rest stay 0
COUNTERS = (
    "env_steps",
    "inserted",
    "sampled",
    "episodes",
    "batch_id",
    "fwd_seq",
    "stale_dropped",
    "too_stale",
    "throttled",
    "prio_received",
    "prio_applied",
    "prio_moved",
    "forwarded",
)
#: the /site fields a placement's side may fill (the rest keep these values)
SITE_FIELDS = {
    "replay_size": 0,
    "forward_queue": 0,
    "forward_dropped": 0,
    "thinned": 0,
    "thin_budget": np.nan,
    "inflight": 0,
    "window": 0,
    "rtt_s": np.nan,
    "rtt_net_s": np.nan,
    "step_s": np.nan,
}


@dataclass
class BufferParts:
    """What the wiring hands a buffer (`mpirl.wiring.build_buffer`)."""

    cfg: Config
    wire: Wire
    log: RunLog
    streams: dict[str, Stream]
    site: SitePort  # toward the actors
    link: LinkEnd  # the long-haul link toward the learner
    inbox: Inbox  # for what the link delivers
    side: SiteSide  # the placement's side
    site_index: int
    raw: RawBytes
    ckpt: Checkpointer | None = None
    resume: Part | None = None


class RawBytes:
    """What compression saved on the messages toward the learner (interval, total)."""

    def __init__(self, wire: Wire) -> None:
        self.wire, self.interval, self.total = wire, 0, 0

    def __call__(self, out: np.ndarray) -> None:
        saved = self.wire.last_raw_nbytes - out.nbytes
        self.interval += saved
        self.total += saved


class Buffer:
    """One buffer rank's state and loop."""

    def __init__(self, parts: BufferParts) -> None:
        p = parts
        self.cfg, self.wire, self.log, self.logs = p.cfg, p.wire, p.log, p.streams
        self.site, self.link, self.inbox, self.side = p.site, p.link, p.inbox, p.side
        self.index, self.raw, self.ckpt = p.site_index, p.raw, p.ckpt
        self.actors = list(range(1, self.site.comm.Get_size()))  # site ranks of the actors
        self.learner_handlers: dict[Tag, Callable[[Any], None]] = {
            Tag.WEIGHTS: self.on_weights,
            Tag.STOP: self.on_stop,
            Tag.CHECKPOINT: self.on_checkpoint,
            Tag.DONE: self.on_done,
            **p.side.handlers,
        }
        self.actor_handlers: dict[Tag, Callable[[Any], None]] = {
            Tag.EXPERIENCE: self.on_experience,
            Tag.CHECKPOINT: self.on_actor_checkpoint,
            Tag.DONE: self.on_actor_done,
        }
        self.backoff, self.fault, self.cut = Backoff(), failure.FAULT, SiteCut(self.actors)
        self.change = p.cfg.link_change_at()
        self.env_steps = self.episodes = self.throttled = 0  # (checkpointed)
        self.owed = {a: 0 for a in self.actors}  # tokens to give back to each actor
        self.acting: dict[int, int] = {}  # actor -> learner updates of the weights it acts with
        self.returns: list[float] = []
        self.weights = WeightCache()  # the site's latest weights: one copy crosses the link
        self.stopping = self.sent_done = self.acked = False
        self.final_ckpt = -1  # the final checkpoint STOP asked for
        self.done_actors: set[int] = set()
        self.t_start = self.t_stats = self.t_log = time.monotonic()
        if p.resume is not None:
            self.restore(p.resume)

    # ---- the loop -----------------------------------------------------------------------------
    def run(self) -> None:
        while not self.acked or self.site.backlog or self.link.backlog:
            now = time.monotonic()
            self.fault.check(now)
            self.change_link(now)
            did = self.receive_learner(now)
            did |= self.receive_actors()
            did |= self.checkpoint(now)
            self.grant_tokens()
            did |= self.side.ship(now, self.stopping)
            self.send_stats(now)
            self.hand_over(now)
            self.report(now)
            self.wait(did)
        self.finish()

    def change_link(self, now: float) -> None:
        if self.change is not None and now - self.t_start >= self.change[0]:
            self.link.set_profile(PROFILES[self.change[1]])
            self.change = None

    # ---- from the learner ---------------------------------------------------------------------
    def receive_learner(self, now: float) -> bool:
        self.link.poll(now)
        msgs = self.link.receive(now)
        self.inbox.deliver(self.learner_handlers, msgs, LEARNER, now)
        return bool(msgs)

    def on_weights(self, m: Weights) -> None:
        """New weights into the site's cache, relayed to every actor as float32 (full messages
        as they came); a delta that does not apply asks the learner for a keyframe."""
        cache = self.weights
        if not cache.apply(m.encoding, m.version, m.updates, m.arrays):
            self.link.post(self.wire.keyframe(cache.version), now=m.t)
            return
        self.side.weights_arrived(m.updates)
        assert cache.params is not None  # apply() succeeded
        if not self.stopping:
            out = (
                m.buf
                if m.encoding == FULL and not m.raw_nbytes and m.buf is not None
                else self.wire.weights(cache.params, m.version, m.updates)
            )
            for a in self.actors:  # relay the same buffer to every actor
                self.site.post(out, dest=a)

    def on_stop(self, m: Stop) -> None:
        self.stopping = True
        self.final_ckpt = m.checkpoint
        for a in self.actors:
            self.site.post(self.wire.stop(m.checkpoint), dest=a)

    def on_checkpoint(self, m: Checkpoint) -> None:
        """The learner starts checkpoint ``m.id``: relay it to every actor."""
        self.cut.begin(m.id)
        for a in self.actors:
            self.site.post(self.wire.checkpoint(m.id), dest=a)

    def on_done(self, m: Done) -> None:
        self.acked = True  # the learner's answer to our DONE: the loop may end

    # ---- from the actors ----------------------------------------------------------------------
    def receive_actors(self) -> bool:
        """At most MAX_ACTOR_MSGS_PER_TURN messages; during a checkpoint only from actors that
        have not acknowledged yet (the others' messages wait in MPI)."""
        return bool(
            self.site.inbox.serve(
                self.actor_handlers, limit=MAX_ACTOR_MSGS_PER_TURN, sources=self.unheld
            )
        )

    def unheld(self) -> list[int] | None:
        """The actors to take messages from: all (None) unless the cut holds some."""
        if not self.cut.held:
            return None
        return [a for a in self.actors if not self.cut.holds(a)]

    def on_experience(self, m: Experience) -> None:
        self.acting[m.rank] = m.acting
        self.env_steps += m.env_steps
        self.returns.extend(m.returns.tolist())
        self.episodes += len(m.returns)
        if m.n:
            self.side.add(m)
        self.owed[m.rank] += 1

    def on_actor_done(self, m: Done) -> None:
        self.done_actors.add(m.rank)
        self.site.post(self.wire.done(0, 0), dest=m.rank)

    def on_actor_checkpoint(self, m: Checkpoint) -> None:
        if not self.cut.acknowledge(m.rank, m.id):
            raise RuntimeError(f"buffer {self.index}: unexpected CHECKPOINT from actor {m.rank}")

    # ---- checkpoint ---------------------------------------------------------------------------
    def checkpoint(self, now: float) -> bool:
        """Every actor's messages before its snapshot are in: write, acknowledge, release."""
        if not self.cut.complete:
            return False
        self.save(self.cut.id)
        self.link.post(self.wire.checkpoint(self.cut.id, self.env_steps), now=now)
        self.cut.end()
        return True

    def counters(self) -> dict[str, float]:
        own = {"env_steps": self.env_steps, "episodes": self.episodes, "throttled": self.throttled}
        return {**dict.fromkeys(COUNTERS, 0), **own, **self.side.counters()}

    def save(self, cid: int) -> None:
        """This buffer's part of checkpoint ``cid``: counters, and what the placement keeps
        here (the replay memory or the forward queue)."""
        placed, arrays = self.side.save()
        meta = {**self.counters(), "forward_dropped": 0, **placed}
        assert self.ckpt is not None
        self.ckpt.write(cid, meta, arrays)

    def restore(self, part: Part) -> None:
        r = part.meta
        self.env_steps, self.episodes, self.throttled = (
            r["env_steps"],
            r["episodes"],
            r["throttled"],
        )
        self.side.restore(r, part.arrays)

    # ---- toward the actors and the learner ----------------------------------------------------
    def grant_tokens(self) -> None:
        """Token control toward the actors: tokens back while the placement's side takes more
        (its rate limiter, or a forward queue with room)."""
        if self.stopping:
            return
        for a in self.actors:
            if not self.owed[a]:
                continue
            if not self.side.may_grant():
                self.throttled += 1
                return  # let the actors wait
            self.site.post(self.wire.credit(self.owed[a]), dest=a)
            self.owed[a] = 0

    def stats(self) -> np.ndarray:
        """STATS: returns, env steps, episodes, and which weights the site and each actor act
        with (the learner's policy lag)."""
        w = self.weights.updates
        return self.wire.stats(self.returns, self.env_steps, self.episodes, w, self.acting)

    def send_stats(self, now: float) -> None:
        if not self.sent_done and now - self.t_stats > STATS_EVERY_S:
            self.link.post(self.stats(), now=now)
            self.returns.clear()
            self.t_stats = now

    def hand_over(self, now: float) -> None:
        """Once stopping, every actor is done and the placement's side has handed everything
        to the link: the final part, the last stats, then DONE."""
        if (
            not self.stopping
            or self.sent_done
            or len(self.done_actors) < len(self.actors)
            or not self.side.drained()
        ):
            return
        if self.final_ckpt >= 0:
            self.save(self.final_ckpt)
        self.link.post(self.stats(), now=now)
        self.link.post(self.wire.done(self.env_steps, self.episodes), now=now)
        self.returns.clear()
        self.sent_done = True

    # ---- report and wait ----------------------------------------------------------------------
    def report(self, now: float) -> None:
        """/link and /site rows every half flush (and a last one at the end); the log's flush."""
        self.site.poll()
        finished = self.acked and not self.site.backlog and not self.link.backlog
        if now - self.t_log >= self.cfg.flush_seconds / 2 or finished:
            self.rows(now)
        self.log.maybe_flush(now)

    def rows(self, now: float) -> None:
        link = self.link
        b_out, m_out, q_s = link.sent.take()
        b_in, m_in, _ = link.received.take()
        dt = max(now - self.t_log, 1e-9)
        self.logs["link"].append(
            bytes_out=b_out,
            raw_bytes_out=b_out + self.raw.interval,
            msgs_out=m_out,
            bytes_in=b_in,
            msgs_in=m_in,
            queue_s=q_s,
            interval_s=dt,
            utilization=min(1.0, b_out * 8 / link.profile.rate_bps / dt),
        )
        counters = {
            k: v for k, v in self.counters().items() if k not in ("episodes", "batch_id", "fwd_seq")
        }
        self.logs["site"].append(**counters, **{**SITE_FIELDS, **self.side.site_row()})
        self.raw.interval = 0
        self.t_log = now

    def wait(self, did: bool) -> None:
        if did:
            self.backoff.work()
        else:
            self.backoff.idle(until=self.link.next_departure())

    def finish(self) -> None:
        link, c = self.link, self.counters()
        self.log.set_attrs(
            env_steps=self.env_steps,
            inserted=c["inserted"],
            sampled=c["sampled"],
            stale_dropped=c["stale_dropped"],
            too_stale=c["too_stale"],
            forward_dropped=self.side.site_row().get("forward_dropped", 0),
            forwarded=c["forwarded"],
            thinned=self.side.site_row().get("thinned", 0),
            wall_s=time.monotonic() - self.t_start,
            link_bytes_out=link.sent.total_bytes,
            link_bytes_in=link.received.total_bytes,
            link_raw_bytes_out=link.sent.total_bytes + self.raw.total,
            link_msgs_out=link.sent.total_msgs,
            link_msgs_in=link.received.total_msgs,
        )
