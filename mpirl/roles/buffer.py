"""Buffer rank: the edge node that collects its site's experiences and faces the long-haul link.

Two placements of the prioritized replay memory (``--replay-at``), same loop:

* ``learner``: every experience is forwarded over the link, in chunks of
  ``forward_chunk``, against tokens the learner grants (``forward_credits`` in flight).  The
  forward queue (`ForwardQueue`) is bounded: when it is full the buffer stops granting tokens to
  its actors (backpressure) or drops the oldest (``--forward-overflow drop-oldest``), so memory
  stays bounded whatever the link does.
* ``buffer``: experiences go into this node's prioritized replay memory; the buffer
  keeps ``inflight`` sampled batches (with importance weights) in flight to the learner and
  applies the priority updates that come back, generation-checked (an update for a slot that
  was overwritten meanwhile is dropped and counted).  Token control paces the actors so the
  learner samples ``replay_ratio`` transitions per inserted one.

`Buffer.run` is the loop; each turn is a list of named steps, each a method:

    receive_learner    weights (decoded into the site's cache, relayed to the actors as float32),
                       priorities, tokens, checkpoint, stop, done: one handler per kind
    receive_actors     experiences, checkpoint acknowledgements, done; at most
                       MAX_ACTOR_MSGS_PER_TURN, so the learner is never starved by a flood
    checkpoint         the site's side of the consistent cut (`mpirl.transport.cut.SiteCut`)
    grant_tokens       token control toward the actors
    send_batches       replay_at=buffer: sampled batches up to the in-flight window
    forward            replay_at=learner: chunks of the forward queue against the learner's tokens
    send_stats         env steps and returns toward the learner
    hand_over          on STOP: the final part, the last stats, DONE
    report, wait       /link and /site rows; yield the core when the turn did nothing
"""

from __future__ import annotations

import time
from collections import deque
from typing import TYPE_CHECKING

import numpy as np

from mpirl.agent.frames import compact, concat
from mpirl.logs import schema
from mpirl.logs.runlog import RunLog
from mpirl.replay.build import beta_at, make_replay
from mpirl.run import failure, seeds
from mpirl.run.checkpoint import memory_state, restore_memory
from mpirl.transport.cut import SiteCut
from mpirl.transport.link import PROFILES
from mpirl.transport.waiting import Backoff
from mpirl.transport.weight_codec import FULL, WeightCache
from mpirl.transport.window import InflightWindow
from mpirl.transport.wire import (
    Checkpoint,
    Credit,
    Done,
    Experience,
    Priorities,
    Stop,
    Tag,
    Weights,
    Wire,
)

if TYPE_CHECKING:
    from mpirl.agent.envs import EnvSpec
    from mpirl.run.config import Config
    from mpirl.transport.topology import Ends, Topology

LEARNER = 0  # link rank of the learner
MAX_ACTOR_MSGS_PER_TURN = 8
STATS_EVERY_S = 0.25  # seconds between STATS messages toward the learner


class ForwardQueue:
    """replay_at=learner: experiences received, not yet forwarded: groups of (records, |td|,
    frame table or None), at most ``limit`` transitions when ``drop_oldest``."""

    def __init__(self, wire: Wire, spec, limit: int, drop_oldest: bool):
        self.wire, self.spec, self.limit, self.drop_oldest = wire, spec, limit, drop_oldest
        self.groups: deque = deque()
        self.len = 0
        self.dropped = 0  # transitions dropped by drop-oldest

    def add(self, records, td_abs, frames=None) -> None:
        self.groups.append((records, td_abs, frames))
        self.len += len(records)
        while self.len > self.limit and self.drop_oldest:
            old, _, _ = self.groups.popleft()
            self.len -= len(old)
            self.dropped += len(old)

    @property
    def full(self) -> bool:
        return self.len >= self.limit

    def take(self, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """Up to ``n`` transitions from the front, as one message's records, |td| and (image
        runs) one frame table holding only the frames they refer to."""
        recs, tds, tables = [], [], []
        k = 0
        while self.groups and k < n:
            r, t, f = self.groups.popleft()
            take = min(len(r), n - k)
            recs.append(r[:take])
            tds.append(t[:take])
            tables.append(f)
            if take < len(r):
                self.groups.appendleft((r[take:], t[take:], f))
            k += take
        self.len -= k
        if self.spec.image:
            records, table = compact(*concat(zip(recs, tables, strict=True)))
        else:
            records, table = np.concatenate(recs), None
        return records, np.concatenate(tds), table

    def state(self) -> dict:
        """The queue as checkpoint arrays (one frame table for the whole queue)."""
        arrays, image = {}, self.spec.image
        if image and self.groups:
            arrays["forward_records"], arrays["forward_frames"] = concat(
                (r, f) for r, _, f in self.groups
            )
        else:
            arrays["forward_records"] = (
                np.concatenate([r for r, _, _ in self.groups])
                if self.groups
                else np.zeros(0, self.wire.record)
            )
            if image:
                arrays["forward_frames"] = np.zeros((0,) + self.spec.frame_shape, np.uint8)
        arrays["forward_td"] = (
            np.concatenate([t for _, t, _ in self.groups]).astype(np.float32)
            if self.groups
            else np.zeros(0, np.float32)
        )
        return arrays

    def restore(self, arrays: dict) -> None:
        if len(arrays["forward_records"]):
            self.groups.append(
                (arrays["forward_records"], arrays["forward_td"], arrays.get("forward_frames"))
            )
            self.len = len(arrays["forward_records"])


#: the buffer's counters: its checkpoint part and its /site rows (with the same names)
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
LATER_COUNTERS = ("prio_received", "prio_applied", "prio_moved", "forwarded")  # may be absent


class Buffer:
    """One buffer rank's state and loop."""

    def __init__(
        self,
        cfg: Config,
        topo: Topology,
        spec: EnvSpec,
        wire: Wire,
        log: RunLog,
        ends: Ends,
        ckpt=None,
        resume=None,
    ):
        """``ends`` (`mpirl.main.connect`): ``site`` toward the actors, ``links[0]`` the
        long-haul link to the learner, ``inbox`` for what it delivers."""
        self.cfg, self.topo, self.spec, self.wire, self.log = cfg, topo, spec, wire, log
        self.ckpt, self.resume = ckpt, resume
        self.site, self.me = ends.site, topo.place
        self.actors = list(range(1, self.site.comm.Get_size()))  # site ranks of the actors
        seed = seeds.buffer(cfg.seed, self.me.rank)
        self.link, self.inbox = ends.links[LEARNER], ends.inbox
        self.memory = (
            make_replay(cfg, spec, wire.record, seed=seed["replay"])
            if cfg.replay_at == "buffer"
            else None
        )
        self.queue = (
            None
            if self.memory is not None
            else ForwardQueue(
                wire,
                spec,
                max(cfg.forward_credits * cfg.forward_chunk, 4 * cfg.actor_chunk),
                cfg.forward_overflow == "drop-oldest",
            )
        )
        self.logs = schema.open_streams(log, "buffer")
        self.learner_handlers = {
            Tag.WEIGHTS: self.on_weights,
            Tag.PRIORITIES: self.on_priorities,
            Tag.CREDIT: self.on_credit,
            Tag.STOP: self.on_stop,
            Tag.CHECKPOINT: self.on_checkpoint,
            Tag.DONE: self.on_done,
        }
        self.actor_handlers = {
            Tag.EXPERIENCE: self.on_experience,
            Tag.CHECKPOINT: self.on_actor_checkpoint,
            Tag.DONE: self.on_actor_done,
        }
        self.backoff = Backoff()
        self.fault = failure.FAULT
        self.cut = SiteCut(self.actors)
        self.window = InflightWindow(cfg.inflight_fixed)
        self.change = cfg.link_change_at()
        # counters (checkpointed)
        self.env_steps = self.inserted = self.sampled = self.episodes = 0
        self.batch_id = self.fwd_seq = 0
        self.stale_dropped = self.too_stale = self.throttled = self.forwarded = 0
        self.prio_received = self.prio_applied = 0
        self.prio_moved = 0.0
        # the loop's state
        self.fwd_tokens = 0  # granted by the learner
        self.owed = {a: 0 for a in self.actors}  # tokens to give back to each actor
        # batch id -> (send time, queue wait, serialization time on the modelled link)
        self.inflight: dict[int, tuple[float, float, float]] = {}
        self.returns: list[float] = []
        self.rtts: list[float] = []
        self.weights_version = -1
        self.weights = WeightCache()  # the site's latest weights: one copy crosses the link
        self.learner_updates = 0  # as the last WEIGHTS / PRIORITIES said: decides beta
        self.stopping = False
        self.final_ckpt = -1  # the final checkpoint STOP asked for
        self.done_actors: set[int] = set()
        self.raw_out = self.raw_total = 0  # bytes compression saved (interval, total)
        self.sent_done = self.acked = False
        self.t_start = self.t_stats = self.t_log = time.monotonic()
        if resume is not None:
            self.restore(resume)

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
            if self.memory is not None:
                did |= self.send_batches(now)
            else:
                did |= self.forward(now)
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
            self.link.post(self.wire.keyframe(cache.version), Tag.KEYFRAME, m.t)
            return
        self.weights_version = m.version
        self.learner_updates = max(self.learner_updates, m.updates)
        if not self.stopping:
            out = (
                m.buf
                if m.encoding == FULL and not m.raw_nbytes
                else self.wire.weights(cache.params, m.version, m.updates)
            )
            for a in self.actors:  # relay the same buffer to every actor
                self.to_actor(out, a, Tag.WEIGHTS)

    def on_priorities(self, m: Priorities) -> None:
        """A batch's new priorities: the window's round trip, then the memory (generation-checked,
        never on an overwritten slot; older than --max-staleness batches: dropped)."""
        now = m.t
        self.learner_updates = max(self.learner_updates, m.updates)
        sent = self.inflight.pop(m.batch_id, None)
        hold, step = m.arrays["timing"]
        if sent is not None:
            self.rtts.append(now - sent[0])
            self.window.observe(now - sent[0], float(hold), sent[1], float(step), sent[2])
        memory = self.memory
        if memory is None:
            return
        self.prio_received += m.n
        if self.cfg.max_staleness and self.batch_id - 1 - m.batch_id > self.cfg.max_staleness:
            self.too_stale += m.n  # too old to trust: GBA's staleness bound
            return
        total = memory.total_priority()
        dropped = memory.update(m.arrays["indices"], m.arrays["generations"], m.arrays["td_abs"])
        self.stale_dropped += dropped
        self.prio_applied += m.n - dropped
        self.prio_moved += abs(memory.total_priority() - total)

    def on_credit(self, m: Credit) -> None:
        self.fwd_tokens += m.tokens

    def on_stop(self, m: Stop) -> None:
        self.stopping = True
        self.final_ckpt = m.checkpoint
        for a in self.actors:
            self.to_actor(self.wire.stop(m.checkpoint), a, Tag.STOP)

    def on_checkpoint(self, m: Checkpoint) -> None:
        """The learner starts checkpoint ``m.id``: relay it to every actor."""
        self.cut.begin(m.id)
        for a in self.actors:
            self.to_actor(self.wire.checkpoint(m.id), a, Tag.CHECKPOINT)

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
        self.env_steps += m.env_steps
        self.returns.extend(m.arrays["returns"].tolist())
        self.episodes += len(m.arrays["returns"])
        if m.n:
            self.inserted += m.n
            args = (m.arrays["records"], m.arrays["td_abs"], m.arrays.get("frames"))
            if self.memory is not None:
                self.memory.add(*args)
            else:
                self.queue.add(*args)
        self.owed[m.rank] += 1

    def on_actor_done(self, m: Done) -> None:
        self.done_actors.add(m.rank)
        self.to_actor(self.wire.done(0, 0), m.rank, Tag.DONE)

    def on_actor_checkpoint(self, m: Checkpoint) -> None:
        if not self.cut.acknowledge(m.rank, m.id):
            raise RuntimeError(f"buffer {self.me.site}: unexpected CHECKPOINT from actor {m.rank}")

    def to_actor(self, buf: np.ndarray, dest: int, tag: Tag) -> None:
        self.site.post(buf, dest=dest, tag=tag)

    # ---- checkpoint ---------------------------------------------------------------------------
    def checkpoint(self, now: float) -> bool:
        """Every actor's messages before its snapshot are in: write, acknowledge, release."""
        if not self.cut.complete:
            return False
        self.save(self.cut.id)
        self.link.post(self.wire.checkpoint(self.cut.id, self.env_steps), Tag.CHECKPOINT, now)
        self.cut.end()
        return True

    def save(self, cid: int) -> None:
        """This buffer's part of checkpoint ``cid``: counters, and the replay memory or the
        forward queue."""
        meta = {k: getattr(self, k) for k in COUNTERS}
        meta["forward_dropped"] = self.queue.dropped if self.queue is not None else 0
        if self.memory is not None:
            arrays, meta["replay"] = memory_state(self.memory)
        else:
            arrays = self.queue.state()
        self.ckpt.write(cid, meta, arrays)

    def restore(self, part) -> None:
        r = part.meta
        for k in COUNTERS:  # (prio_* and forwarded: absent in parts of older versions)
            setattr(self, k, r.get(k, 0) if k in LATER_COUNTERS else r[k])
        dropped = r["forward_dropped"]
        if self.memory is not None:
            restore_memory(self.memory, part.arrays, r["replay"])
        else:
            self.queue.dropped = dropped
            self.queue.restore(part.arrays)

    # ---- toward the actors and the learner ----------------------------------------------------
    def grant_tokens(self) -> None:
        """Token control toward the actors (the rate limiter of the pipeline)."""
        if self.stopping:
            return
        cfg = self.cfg
        for a in self.actors:
            if not self.owed[a]:
                continue
            if self.memory is not None:
                if (
                    cfg.replay_ratio > 0
                    and self.inserted > cfg.learning_starts + self.sampled / cfg.replay_ratio
                ):
                    self.throttled += 1
                    return  # learner behind: let actors wait
            elif self.queue.full and cfg.forward_overflow == "block":
                self.throttled += 1
                return  # forward queue full: backpressure
            self.to_actor(self.wire.credit(self.owed[a]), a, Tag.CREDIT)
            self.owed[a] = 0

    def send_batches(self, now: float) -> bool:
        """replay_at=buffer: sampled batches up to the window, after the first weights (they
        say how many updates the learner has made: beta is the learner's, never this site's);
        the replay ratio holds sampling too (actors are throttled in the other direction, so
        one side can always move)."""
        cfg, memory = self.cfg, self.memory
        if self.stopping or self.weights_version < 0:
            return False
        beta = beta_at(cfg, self.learner_updates)
        memory.beta = beta
        did = False
        while (
            len(self.inflight) < self.window.size
            and len(memory) >= cfg.learning_starts
            and len(memory) > 0
            and (
                cfg.replay_ratio == 0
                or self.sampled <= cfg.replay_ratio * (self.inserted - cfg.learning_starts)
            )
        ):
            sample = memory.sample(cfg.batch_size)
            max_w = memory.max_weight()
            out = self.wire.batch(
                sample, self.batch_id, now, max_weight=max_w, window=self.window.size
            )
            wait = self.link.post(out, Tag.BATCH, now)
            self.count_compression(out)
            self.logs["batches"].append(
                batch=self.batch_id,
                priority_mean=float(sample.priorities.mean()),
                size=len(memory),
                beta=beta,
                max_weight=max_w,
            )
            tx = out.nbytes * 8 / self.link.profile.rate_bps  # 0 on a real link
            self.inflight[self.batch_id] = (now, wait, tx)
            self.batch_id += 1
            self.sampled += cfg.batch_size
            did = True
        return did

    def forward(self, now: float) -> bool:
        """replay_at=learner: a chunk per token while a full chunk waits (all that is left once
        stopping)."""
        cfg, q = self.cfg, self.queue
        did = False
        while q.groups and self.fwd_tokens > 0 and (q.len >= cfg.forward_chunk or self.stopping):
            records, td, table = q.take(cfg.forward_chunk)
            self.forwarded += len(records)
            out = self.wire.forward(records, td, self.fwd_seq, frames=table)
            self.link.post(out, Tag.FORWARD, now)
            self.count_compression(out)
            self.fwd_seq += 1
            self.fwd_tokens -= 1
            did = True
        return did

    def count_compression(self, out: np.ndarray) -> None:
        saved = self.wire.last_raw_nbytes - out.nbytes
        self.raw_out += saved
        self.raw_total += saved

    def send_stats(self, now: float) -> None:
        if not self.sent_done and now - self.t_stats > STATS_EVERY_S:
            self.link.post(
                self.wire.stats(self.returns, self.env_steps, self.episodes, self.weights.updates),
                Tag.STATS,
                now,
            )
            self.returns.clear()
            self.t_stats = now

    def hand_over(self, now: float) -> None:
        """Once stopping, every actor is done and the queue is empty: everything this site
        produced has been handed to the link; the final part, the last stats, then DONE."""
        if (
            not self.stopping
            or self.sent_done
            or len(self.done_actors) < len(self.actors)
            or (self.queue is not None and self.queue.len)
        ):
            return
        if self.final_ckpt >= 0:
            self.save(self.final_ckpt)
        self.link.post(
            self.wire.stats(self.returns, self.env_steps, self.episodes, self.weights.updates),
            Tag.STATS,
            now,
        )
        self.link.post(self.wire.done(self.env_steps, self.episodes), Tag.DONE, now)
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
        link, window, memory = self.link, self.window, self.memory
        b_out, m_out, q_s = link.sent.take()
        b_in, m_in, _ = link.received.take()
        dt = max(now - self.t_log, 1e-9)
        self.logs["link"].append(
            bytes_out=b_out,
            raw_bytes_out=b_out + self.raw_out,
            msgs_out=m_out,
            bytes_in=b_in,
            msgs_in=m_in,
            queue_s=q_s,
            interval_s=dt,
            utilization=min(1.0, b_out * 8 / link.profile.rate_bps / dt),
        )
        counters = {
            k: getattr(self, k) for k in COUNTERS if k not in ("episodes", "batch_id", "fwd_seq")
        }
        self.logs["site"].append(
            **counters,
            replay_size=len(memory) if memory is not None else 0,
            forward_queue=self.queue.len if self.queue is not None else 0,
            forward_dropped=self.queue.dropped if self.queue is not None else 0,
            inflight=len(self.inflight),
            window=window.size,
            rtt_s=float(np.mean(self.rtts)) if self.rtts else np.nan,
            rtt_net_s=window.rtt_net if window.rtt_net is not None else np.nan,
            step_s=window.step if window.step is not None else np.nan,
        )
        self.rtts.clear()
        self.raw_out = 0
        self.t_log = now

    def wait(self, did: bool) -> None:
        if did:
            self.backoff.work()
        else:
            self.backoff.idle(until=self.link.next_departure())

    def finish(self) -> None:
        link = self.link
        self.log.set_attrs(
            env_steps=self.env_steps,
            inserted=self.inserted,
            sampled=self.sampled,
            stale_dropped=self.stale_dropped,
            too_stale=self.too_stale,
            forward_dropped=self.queue.dropped if self.queue is not None else 0,
            forwarded=self.forwarded,
            wall_s=time.monotonic() - self.t_start,
            link_bytes_out=link.sent.total_bytes,
            link_bytes_in=link.received.total_bytes,
            link_raw_bytes_out=link.sent.total_bytes + self.raw_total,
            link_msgs_out=link.sent.total_msgs,
            link_msgs_in=link.received.total_msgs,
        )
