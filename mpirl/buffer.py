"""Buffer rank: the edge node that collects its site's experiences and faces the long-haul link.

Two placements of the prioritized replay memory (``--replay-at``), same loop:

* ``learner`` (existing, Ape-X style): every experience is forwarded over the link, in chunks of
  ``forward_chunk``, against tokens the learner grants (``forward_credits`` in flight).  The
  forward queue is bounded: when it is full the buffer stops granting tokens to its actors
  (backpressure), so memory stays bounded whatever the link does.
* ``buffer`` (proposed): experiences go into this node's prioritized replay memory; the buffer
  keeps ``inflight`` sampled batches (with importance weights) in flight to the learner and
  applies the priority updates that come back, generation-checked (an update for a slot that
  was overwritten meanwhile is dropped and counted).  Token control paces the actors so the
  learner samples ``replay_ratio`` transitions per inserted one.

Per loop turn: [link] deliver what the learner sent (weights -> relayed to actors, priorities,
tokens, stop); [site] take at most ``actor_chunk``-sized work from actors (bounded, so the learner
is never starved by a flood of actor messages); [link] send batches / forwarded chunks; grant
tokens; stats; idle back-off.

Checkpoints: CHECKPOINT from the learner is forwarded to every actor; each actor snapshots and
acknowledges, and the buffer holds that actor's later messages (they stay queued in MPI) until
every actor has acknowledged.  Then it writes its part (replay memory or forward queue,
counters), acknowledges to the learner and releases the actors.  Everything an actor sent before
its snapshot is in the buffer's part, nothing after: env steps and transitions are counted once.
On STOP with a checkpoint id it writes its final part before DONE.
"""

from __future__ import annotations

import time
from collections import deque

import numpy as np
from mpi4py import MPI

from mpirl import failure, seeds
from mpirl.checkpoint import memory_state, restore_memory
from mpirl.frames import compact, concat
from mpirl.link import PROFILES, LinkEnd, resolve_profile
from mpirl.logs import Field, RunLog
from mpirl.replay.build import beta_at, make_replay
from mpirl.waiting import Backoff
from mpirl.window import InflightWindow
from mpirl.wire import Tag, Wire

LEARNER = 0  # link rank of the learner
MAX_ACTOR_MSGS_PER_TURN = 8


def run(cfg, topo, spec, wire: Wire, log: RunLog, ckpt=None, resume=None) -> None:
    site, me = topo.site, topo.place
    actors = list(range(1, site.Get_size()))  # site ranks of this buffer's actors
    seed = seeds.buffer(cfg.seed, me.rank)
    link = LinkEnd(topo.link, LEARNER, resolve_profile(cfg), seed=seed["link"])
    at_buffer = cfg.replay_at == "buffer"
    memory = make_replay(cfg, spec, wire.record, seed=seed["replay"]) if at_buffer else None
    image = spec.image

    link_log = log.stream("link", [
        Field("bytes_out", "i8", "bytes", "bytes sent toward the learner in the interval"),
        Field("raw_bytes_out", "i8", "bytes", "the same messages before compression "
              "(= bytes_out when --compress is off)"),
        Field("msgs_out", "i8", "messages", "messages sent toward the learner"),
        Field("bytes_in", "i8", "bytes", "bytes received from the learner"),
        Field("msgs_in", "i8", "messages", "messages received from the learner"),
        Field("queue_s", "f8", "s", "summed time messages waited for the modelled bandwidth"),
        Field("interval_s", "f8", "s", "length of the interval"),
        Field("utilization", "f4", "", "fraction of the interval the outgoing side was busy "
              "at the modelled bandwidth (0 without emulation)"),
    ], doc="this buffer's side of the long-haul link, one row per interval")
    site_log = log.stream("site", [
        Field("env_steps", "i8", "steps", "env steps of this site's actors so far"),
        Field("inserted", "i8", "transitions", "transitions received from actors so far"),
        Field("sampled", "i8", "transitions", "transitions sent as batches (replay_at=buffer)"),
        Field("replay_size", "i8", "transitions", "items in this buffer's replay memory"),
        Field("stale_dropped", "i8", "priorities", "priority updates dropped: slot overwritten"),
        Field("forward_queue", "i8", "transitions", "transitions waiting to be forwarded"),
        Field("inflight", "i4", "batches", "sampled batches awaiting their priority update"),
        Field("window", "i4", "batches", "batches allowed in flight (--inflight; auto: chosen)"),
        Field("rtt_s", "f8", "s", "mean batch round trip in the interval (send -> update)"),
        Field("rtt_net_s", "f8", "s", "auto window's smoothed round trip on the wire"),
        Field("step_s", "f8", "s", "learner's time per update as it reports it"),
        Field("too_stale", "i8", "priorities", "priority updates dropped: older than "
              "max_staleness batches"),
        Field("forward_dropped", "i8", "transitions", "dropped by --forward-overflow "
              "drop-oldest"),
        Field("forwarded", "i8", "transitions", "sent toward the learner (replay_at=learner): "
              "inserted = forwarded + forward_dropped + forward_queue"),
        Field("throttled", "i8", "tokens", "actor tokens held back so far (token control)"),
        Field("prio_received", "i8", "priorities", "priority updates received from the learner "
              "so far (= prio_applied + stale_dropped + too_stale)"),
        Field("prio_applied", "i8", "priorities", "priority updates written into the replay "
              "memory so far"),
        Field("prio_moved", "f8", "", "sum over applied batches of |change of the memory's "
              "total priority| (0: the updates never changed what gets sampled)"),
    ], doc="buffer counters, one row per interval")
    batch_log = log.stream("batches", [
        Field("batch", "i8", "", "batch id"),
        Field("priority_mean", "f4", "", "mean priority p the memory held for the batch"),
        Field("size", "i8", "transitions", "replay memory size when sampled"),
        Field("beta", "f4", "", "importance-weight exponent the batch was sampled with"),
        Field("max_weight", "f4", "", "the memory's largest importance weight relative to "
              "uniform sampling, (mean p / min p)^beta: the batch's weights are divided by it; "
              "the learner rescales to the largest of all sites'"),
    ], doc="replay_at=buffer: every batch sampled and sent over the link")

    status = MPI.Status()
    backoff = Backoff()
    site_sends: list = []
    fwd_records: deque = deque()  # (records, td_abs, frames) waiting to be forwarded (learner mode)
    fwd_len = 0
    fwd_limit = max(cfg.forward_credits * cfg.forward_chunk, 4 * cfg.actor_chunk)
    fwd_tokens = 0  # granted by the learner
    owed = {a: 0 for a in actors}  # tokens to give back to each actor
    inflight: dict[int, tuple[float, float]] = {}  # batch id -> (send time, queue wait)
    window = InflightWindow(cfg.inflight_fixed)
    too_stale = fwd_dropped = throttled = forwarded = 0
    change = cfg.link_change_at()
    batch_id = fwd_seq = 0
    env_steps = inserted = sampled = episodes = 0
    stale = 0
    prio_received = prio_applied = 0
    prio_moved = 0.0
    returns: list[float] = []
    rtts: list[float] = []
    weights_version = -1
    learner_updates = 0  # as the last WEIGHTS / PRIORITIES said: decides beta
    stopping = False
    done_actors: set[int] = set()
    raw_out = raw_total = 0  # bytes compression saved toward the learner (interval, total)
    t_start = t_stats = t_log = time.monotonic()
    sent_done = False
    acked = False
    fault = failure.FAULT
    ckpt_id = final_ckpt = -1  # checkpoint in progress; final checkpoint (from STOP)
    ckpt_held: set[int] = set()  # actors that acknowledged: their later messages wait

    def save(cid: int) -> None:
        """This buffer's part of checkpoint ``cid``."""
        arrays = {}
        meta = {"env_steps": env_steps, "inserted": inserted, "sampled": sampled,
                "episodes": episodes, "batch_id": batch_id, "fwd_seq": fwd_seq,
                "stale_dropped": stale, "too_stale": too_stale, "forward_dropped": fwd_dropped,
                "throttled": throttled, "prio_received": prio_received,
                "prio_applied": prio_applied, "prio_moved": prio_moved, "forwarded": forwarded}
        if memory is not None:
            arrays, meta["replay"] = memory_state(memory)
        else:  # the forward queue: experiences received, not yet sent to the learner
            if image and fwd_records:  # one frame table for the whole queue
                arrays["forward_records"], arrays["forward_frames"] = concat(
                    (r, f) for r, _, f in fwd_records)
            else:
                arrays["forward_records"] = (np.concatenate([r for r, _, _ in fwd_records])
                                             if fwd_records else np.zeros(0, wire.record))
                if image:
                    arrays["forward_frames"] = np.zeros((0,) + spec.frame_shape, np.uint8)
            arrays["forward_td"] = (np.concatenate([t for _, t, _ in fwd_records])
                                    .astype(np.float32) if fwd_records
                                    else np.zeros(0, np.float32))
        ckpt.write(cid, meta, arrays)

    if resume is not None:
        r = resume.meta
        env_steps, inserted, sampled, episodes = (r["env_steps"], r["inserted"], r["sampled"],
                                                  r["episodes"])
        batch_id, fwd_seq, stale = r["batch_id"], r["fwd_seq"], r["stale_dropped"]
        too_stale, fwd_dropped, throttled = r["too_stale"], r["forward_dropped"], r["throttled"]
        prio_received, prio_applied = r.get("prio_received", 0), r.get("prio_applied", 0)
        prio_moved = r.get("prio_moved", 0.0)
        forwarded = r.get("forwarded", 0)
        if memory is not None:
            restore_memory(memory, resume.arrays, r["replay"])
        elif len(resume.arrays["forward_records"]):
            fwd_records.append((resume.arrays["forward_records"], resume.arrays["forward_td"],
                                resume.arrays.get("forward_frames")))
            fwd_len = len(resume.arrays["forward_records"])

    def to_site(buf: np.ndarray, dest: int, tag: Tag) -> None:
        site_sends.append((site.Isend([buf, MPI.BYTE], dest=dest, tag=tag), buf))

    def grant_actor_tokens() -> None:
        """Token control toward the actors (the rate limiter of the pipeline)."""
        nonlocal throttled
        if stopping:
            return
        for a in actors:
            if not owed[a]:
                continue
            if at_buffer:
                if cfg.replay_ratio > 0 and inserted > cfg.learning_starts + sampled / cfg.replay_ratio:
                    throttled += 1
                    return  # learner behind: let actors wait
            elif fwd_len >= fwd_limit and cfg.forward_overflow == "block":
                throttled += 1
                return  # forward queue full: backpressure
            to_site(wire.credit(owed[a]), a, Tag.CREDIT)
            owed[a] = 0

    while not acked or site_sends or link.backlog:
        now = time.monotonic()
        fault.check(now)
        did = False
        if change is not None and now - t_start >= change[0]:
            link.set_profile(PROFILES[change[1]])
            change = None
        link.poll(now)
        # [link] what the learner sent
        for tag, buf in link.receive(now):
            did = True
            m = wire.unpack(buf, tag, "the learner")
            if m.kind == Tag.WEIGHTS:
                weights_version = m.seq
                learner_updates = max(learner_updates, int(m.a))
                if not stopping:
                    for a in actors:  # relay the same buffer to every actor
                        to_site(buf, a, Tag.WEIGHTS)
            elif m.kind == Tag.PRIORITIES:
                learner_updates = max(learner_updates, int(m.b))
                sent = inflight.pop(m.seq, None)
                hold, step = m.arrays["timing"]
                if sent is not None:
                    rtts.append(now - sent[0])
                    window.observe(now - sent[0], float(hold), sent[1], float(step))
                if memory is not None:
                    prio_received += m.count
                    if cfg.max_staleness and batch_id - 1 - m.seq > cfg.max_staleness:
                        too_stale += m.count  # too old to trust: GBA's staleness bound
                    else:  # generation-checked: never lands on an overwritten slot
                        total = memory.total_priority()
                        dropped = memory.update(m.arrays["indices"], m.arrays["generations"],
                                                m.arrays["td_abs"])
                        stale += dropped
                        prio_applied += m.count - dropped
                        prio_moved += abs(memory.total_priority() - total)
            elif m.kind == Tag.CREDIT:
                fwd_tokens += m.count
            elif m.kind == Tag.STOP:
                stopping = True
                final_ckpt = m.seq
                for a in actors:
                    to_site(wire.stop(m.seq), a, Tag.STOP)
            elif m.kind == Tag.CHECKPOINT:
                ckpt_id = m.seq
                for a in actors:
                    to_site(wire.checkpoint(ckpt_id), a, Tag.CHECKPOINT)
            elif m.kind == Tag.DONE:
                acked = True
            else:
                raise RuntimeError(f"buffer {me.site}: unexpected {m.kind.name} from the learner")
        # [site] experiences from actors, bounded work per turn
        for _ in range(MAX_ACTOR_MSGS_PER_TURN):
            if not ckpt_held:
                msg = site.Improbe(source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG, status=status)
            else:  # during a checkpoint: only actors that have not acknowledged yet
                msg = None
                for a in actors:
                    if a not in ckpt_held:
                        msg = site.Improbe(source=a, tag=MPI.ANY_TAG, status=status)
                        if msg is not None:
                            break
            if msg is None:
                break
            did = True
            src, tag = status.Get_source(), status.Get_tag()
            buf = np.empty(status.Get_count(MPI.BYTE), np.uint8)
            msg.Recv([buf, MPI.BYTE])
            m = wire.unpack(buf, tag, f"actor (site rank {src})")
            if m.kind == Tag.EXPERIENCE:
                env_steps += int(m.a)
                returns.extend(m.arrays["returns"].tolist())
                episodes += len(m.arrays["returns"])
                if m.count:
                    inserted += m.count
                    frames = m.arrays.get("frames")
                    if memory is not None:
                        if image:
                            memory.add(m.arrays["records"], frames, m.arrays["td_abs"])
                        else:
                            memory.add(m.arrays["records"], m.arrays["td_abs"])
                    else:
                        fwd_records.append((m.arrays["records"], m.arrays["td_abs"], frames))
                        fwd_len += m.count
                        while fwd_len > fwd_limit and cfg.forward_overflow == "drop-oldest":
                            old, _, _ = fwd_records.popleft()
                            fwd_len -= len(old)
                            fwd_dropped += len(old)
                owed[src] += 1
            elif m.kind == Tag.DONE:
                done_actors.add(src)
                to_site(wire.done(0, 0), src, Tag.DONE)
            elif m.kind == Tag.CHECKPOINT and m.seq == ckpt_id:
                ckpt_held.add(src)
            else:
                raise RuntimeError(f"buffer {me.site}: unexpected {m.kind.name} from actor {src}")
        if ckpt_id >= 0 and len(ckpt_held) == len(actors):
            # every actor's messages before its snapshot are in: snapshot, ack, release
            save(ckpt_id)
            link.post(wire.checkpoint(ckpt_id, env_steps), Tag.CHECKPOINT, now)
            ckpt_id = -1
            ckpt_held.clear()
            did = True
        grant_actor_tokens()
        # [link] toward the learner
        # (not before the first weights: they say how many updates the learner has made)
        if memory is not None and not stopping and weights_version >= 0:
            beta = beta_at(cfg, learner_updates)  # the learner's, never this site's own count
            memory.beta = beta
            # the replay ratio holds this side too: no sampling ahead of the inserts (actors
            # are throttled in the other direction, so one side can always move)
            while len(inflight) < window.size and len(memory) >= cfg.learning_starts \
                    and len(memory) > 0 and (cfg.replay_ratio == 0 or sampled <= cfg.replay_ratio
                                             * (inserted - cfg.learning_starts)):
                table = None
                if image:
                    sample, table = memory.sample(cfg.batch_size)
                else:
                    sample = memory.sample(cfg.batch_size)
                max_w = memory.max_weight()
                out = wire.batch(sample, batch_id, now, frames=table, max_weight=max_w,
                                 window=window.size)
                wait = link.post(out, Tag.BATCH, now)
                raw_out += wire.last_raw_nbytes - out.nbytes  # what compression saved
                raw_total += wire.last_raw_nbytes - out.nbytes
                batch_log.append(batch=batch_id, priority_mean=float(sample.priorities.mean()),
                                 size=len(memory), beta=beta, max_weight=max_w)
                inflight[batch_id] = (now, wait)
                batch_id += 1
                sampled += cfg.batch_size
                did = True
        elif memory is None:
            while fwd_records and fwd_tokens > 0 and (fwd_len >= cfg.forward_chunk or stopping):
                recs, tds, tables = [], [], []
                k = 0
                while fwd_records and k < cfg.forward_chunk:
                    r, t, f = fwd_records.popleft()
                    take = min(len(r), cfg.forward_chunk - k)
                    recs.append(r[:take])
                    tds.append(t[:take])
                    tables.append(f)
                    if take < len(r):
                        fwd_records.appendleft((r[take:], t[take:], f))
                    k += take
                fwd_len -= k
                forwarded += k
                table = None
                if image:  # one frame table; frames of the parts not sent now are left out
                    rec_all, table = compact(*concat(zip(recs, tables)))
                else:
                    rec_all = np.concatenate(recs)
                out = wire.forward(rec_all, np.concatenate(tds), fwd_seq, frames=table)
                link.post(out, Tag.FORWARD, now)
                raw_out += wire.last_raw_nbytes - out.nbytes  # what compression saved
                raw_total += wire.last_raw_nbytes - out.nbytes
                fwd_seq += 1
                fwd_tokens -= 1
                did = True
        if not sent_done and now - t_stats > 0.25:
            link.post(wire.stats(returns, env_steps, episodes), Tag.STATS, now)
            returns.clear()
            t_stats = now
        if stopping and not sent_done and len(done_actors) == len(actors) and not fwd_len:
            # everything this site produced has been handed to the link: say so, last
            if final_ckpt >= 0:
                save(final_ckpt)
            link.post(wire.stats(returns, env_steps, episodes), Tag.STATS, now)
            link.post(wire.done(env_steps, episodes), Tag.DONE, now)
            returns.clear()
            sent_done = True
        if site_sends:
            site_sends[:] = [(r, b) for r, b in site_sends if not r.Test()]
        finished = acked and not site_sends and not link.backlog
        if now - t_log >= cfg.flush_seconds / 2 or finished:  # and a last row at the end
            b_out, m_out, q_s = link.sent.take()
            b_in, m_in, _ = link.received.take()
            dt = max(now - t_log, 1e-9)
            link_log.append(bytes_out=b_out, raw_bytes_out=b_out + raw_out,
                            msgs_out=m_out, bytes_in=b_in, msgs_in=m_in,
                            queue_s=q_s, interval_s=dt,
                            utilization=min(1.0, b_out * 8 / link.profile.rate_bps / dt))
            site_log.append(env_steps=env_steps, inserted=inserted, sampled=sampled,
                            replay_size=len(memory) if memory is not None else 0,
                            stale_dropped=stale, forward_queue=fwd_len, inflight=len(inflight),
                            window=window.size, rtt_s=float(np.mean(rtts)) if rtts else np.nan,
                            rtt_net_s=window.rtt_net if window.rtt_net is not None else np.nan,
                            step_s=window.step if window.step is not None else np.nan,
                            too_stale=too_stale, forward_dropped=fwd_dropped,
                            throttled=throttled, prio_received=prio_received,
                            prio_applied=prio_applied, prio_moved=prio_moved,
                            forwarded=forwarded)
            rtts.clear()
            raw_out = 0
            t_log = now
        log.maybe_flush(now)
        if did:
            backoff.work()
        else:
            nd = link.next_departure()
            backoff.idle(until=nd)
    log.set_attrs(env_steps=env_steps, inserted=inserted, sampled=sampled,
                  stale_dropped=stale, too_stale=too_stale, forward_dropped=fwd_dropped,
                  forwarded=forwarded,
                  wall_s=time.monotonic() - t_start,
                  link_bytes_out=link.sent.total_bytes, link_bytes_in=link.received.total_bytes,
                  link_raw_bytes_out=link.sent.total_bytes + raw_total,
                  link_msgs_out=link.sent.total_msgs, link_msgs_in=link.received.total_msgs)
