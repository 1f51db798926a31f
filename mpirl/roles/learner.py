"""Learner rank (the cloud): trains the DQN and decides when the run stops.

`Learner.run` is the loop; each turn is a list of named steps, each a method:

    receive        take what every buffer sent; one handler per message kind (``on_<kind>``)
    group          --learners K: the other learners' answers, orders for them, the global
                   updates of async / gba (`mpirl.roles.group_lead`; K = 1: nothing)
    checkpoint     advance the consistent cut (`mpirl.transport.cut.Cut`): start one, write when
                   complete
    grant_tokens   replay_at=learner: tokens for more forwarded experiences (rate limiter)
    train          one double-DQN update (`mpirl.agent.train_step.TrainStep`) on the next batch, its
                   priorities back to the buffer (replay_at=buffer) or into the memory here
    evaluate       greedy evaluation off the update loop (``--evaluator``); the best weights
    decide_stop    target return, env-step / update / time budget, SIGTERM
    send_stop      STOP to every buffer, once, after any checkpoint in progress
    report         the progress line and /progress, /link rows
    wait           yield the core when the turn did nothing

Stop protocol: the learner sends STOP to every buffer and keeps serving the link until each
buffer answers DONE (it has collected DONE from its actors and handed everything over), then
acknowledges with DONE.  No rank is left waiting; every file is closed.

Checkpoints (``checkpoint_seconds``, and always at a clean stop): see `mpirl.transport.cut`.  The
learner's part holds the networks, optimizer, counters, RNG states and the replay memory at the
learner; the manifest is written last.
"""

from __future__ import annotations

import os
import time
from collections import deque
from typing import TYPE_CHECKING

import numpy as np

from mpirl.agent import device as device_mod
from mpirl.agent.train_step import TrainStep
from mpirl.logs import schema
from mpirl.logs.runlog import RunLog
from mpirl.replay.build import beta_at, make_replay
from mpirl.roles import best_model
from mpirl.roles.evaluation import make_runner
from mpirl.roles.group_lead import make_group
from mpirl.roles.learner_group import shard_config
from mpirl.roles.learner_rows import HeldRows, small_mean, spread, td_units
from mpirl.run import failure, seeds
from mpirl.run.checkpoint import memory_state, params_sha256, part_name, restore_memory
from mpirl.transport.cut import Cut
from mpirl.transport.link import PROFILES
from mpirl.transport.pacing import TokenBucket
from mpirl.transport.waiting import Backoff
from mpirl.transport.weight_sync import WeightSync
from mpirl.transport.wire import Batch, Checkpoint, Done, Forward, Keyframe, Stats, Tag, Wire

if TYPE_CHECKING:
    from mpirl.agent.envs import EnvSpec
    from mpirl.run.config import Config
    from mpirl.transport.link import LinkEnd
    from mpirl.transport.topology import Ends, Topology

__all__ = ["CKPT_TIMEOUT_S", "EVAL_DRAIN_S", "Learner", "Site", "TrainStep", "checkpoint_timeout_s"]


EVAL_DRAIN_S = 15.0  # at the stop, wait this long at most for the evaluation in flight
CKPT_TIMEOUT_S = 120.0  # a checkpoint not acknowledged by every buffer by then aborts the job


def checkpoint_timeout_s(cfg, spec) -> float:
    """CKPT_TIMEOUT_S plus the time a healthy buffer may take to write its replay memory
    (``checkpoint.write_allowance_s``): a large memory must not abort a healthy checkpoint."""
    from mpirl.replay.build import replay_footprint
    from mpirl.run.checkpoint import write_allowance_s

    if cfg.replay_at != "buffer":
        return CKPT_TIMEOUT_S
    return CKPT_TIMEOUT_S + write_allowance_s(replay_footprint(cfg, spec))


def rss_bytes() -> int:
    """This process's resident memory now (Linux /proc; -1 where there is none)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return -1


class Site:
    """What the learner keeps per buffer (one edge site), ``rank`` its link rank."""

    def __init__(self, rank: int, link: LinkEnd, weight: float):
        self.rank, self.index, self.link, self.weight = rank, rank - 1, link, weight
        self.steps = 0  # env steps of its actors, as last reported
        self.ready: deque = deque()  # replay_at=buffer: (BATCH, bytes, arrival, raw) untrained
        self.max_weight = 0.0  # its memory's max importance weight, of its batch trained last
        self.served = 0  # batches trained (replay_at=buffer) / transitions inserted (learner)
        self.owed = 0  # replay_at=learner: forward tokens to give back
        self.done = False  # it sent DONE: nothing more is posted to it

    def share(self) -> float:
        """How far it is behind its --site-weights share: the smallest goes next."""
        return self.served / self.weight


class Learner:
    """The learner rank's state and loop; ``run()`` returns the run's summary (summary.json)."""

    def __init__(
        self,
        cfg: Config,
        topo: Topology,
        spec: EnvSpec,
        wire: Wire,
        log: RunLog,
        ends: Ends,
        say=print,
        stop_signal=None,
        ckpt=None,
        resume=None,
        refset: tuple[str, str] | None = None,
    ):
        """``ends`` (`mpirl.main.connect`): ``links`` (link rank b -> the end toward buffer
        b - 1) with the ``inbox`` for what they deliver; ``group`` and ``group_inbox`` toward
        the other learners (--learners K)."""
        import torch

        self.cfg, self.topo, self.spec, self.wire, self.log = cfg, topo, spec, wire, log
        self.say, self.stop_signal, self.ckpt, self.resume = say, stop_signal, ckpt, resume
        self.refset, self.torch = refset, torch
        torch.set_num_threads(cfg.torch_threads)
        self.seed = seeds.learner(cfg.seed, len(ends.links))
        torch.manual_seed(self.seed["torch"])
        self.sites = {
            b: Site(b, end, cfg.site_weights[b - 1] if cfg.site_weights else 1.0)
            for b, end in sorted(ends.links.items())
        }
        self.inbox = ends.inbox
        dev = device_mod.resolve(cfg.device, torch)
        dev_info = device_mod.describe(dev, torch)
        log.set_attrs(**dev_info)
        say(device_mod.banner(dev_info, cfg.amp))
        self.trainer = TrainStep(cfg, spec, dev, cfg.amp)
        self.at_learner = cfg.replay_at == "learner"
        group = getattr(topo, "learners", None)  # (a bench or test may pass a bare topology)
        k = group.Get_size() if group is not None else 1
        self.memory = (
            make_replay(shard_config(cfg, k), spec, wire.record, seed=self.seed["replay"])
            if self.at_learner
            else None
        )
        target = cfg.target_return if cfg.target_return is not None else spec.reward_threshold
        self.target_return = target if target is not None and np.isfinite(target) else None
        log.set_attrs(target_return=self.target_return)
        self.logs = schema.open_streams(log, "learner")
        self.rows = HeldRows(self.logs, log, cfg.alpha, cfg.priority_eps, cfg.huber_delta)
        self.handlers = {
            Tag.BATCH: self.on_batch,
            Tag.FORWARD: self.on_forward,
            Tag.STATS: self.on_stats,
            Tag.DONE: self.on_done,
            Tag.CHECKPOINT: self.on_checkpoint,
            Tag.KEYFRAME: self.on_keyframe,
        }
        self.arrival_rng = np.random.default_rng(self.seed["arrival"])
        self.backoff = Backoff()
        self.fault = failure.FAULT
        self.zero_counters()
        # the loop's state
        self.flat = (-1, None)  # (updates, flat weights) of the last broadcast
        self.sync = WeightSync(cfg, wire, self.sites)  # when and how weights are broadcast
        self.staged = None  # the next batch, already on its way to the device
        self.beta = cfg.beta
        self.busy = 0.0  # seconds spent on updates
        self.loss_sum, self.loss_n = 0.0, 0  # over the progress interval
        self.recent = deque(maxlen=100)  # the actors' last episode returns
        self.stop_reason = None
        self.stop_sent = False
        self.final_ckpt = -1
        self.step_s = None  # smoothed seconds per update, reported with the priorities
        self.change = cfg.link_change_at()
        # --learner-updates-per-s: a token per update (started with the loop, after start-up)
        self.cap = TokenBucket(cfg.learner_updates_per_s) if cfg.learner_updates_per_s else None
        self.capped_s = 0.0  # time a batch was staged but the cap held it
        self.t_turn = None  # start of the last turn the cap held an update
        self.t_start = time.monotonic()
        self.t_prog = self.t_link = self.t_start
        log.set_attrs(loop_start_t=log.elapsed())  # the summary's clock on the log's clock
        self.prog = {
            "steps": 0,
            "updates": 0,
            "inserted": 0,
            "capped": 0.0,
            "busy": 0.0,
            "link": 0,
            "idle": 0.0,
        }  # the totals at the last progress row
        self.cut = Cut(
            ckpt, self.sites, cfg.checkpoint_seconds, checkpoint_timeout_s(cfg, spec), self.t_start
        )
        self.part_names = [part_name(p.role, p.site, p.rank) for p in topo.places]
        self.eval_runner = None
        self.group = make_group(self, ends)  # --learners K: the other learners (K = 1: no-op)
        self.trainer.sync = self.group.sync

    def zero_counters(self) -> None:
        """The counters a checkpoint holds, at the start of a run (`restore` sets them on
        --resume)."""
        self.updates = 0
        self.weights_version = -1
        self.inserted = self.sampled = 0
        self.eval_round = 0
        self.last_eval = -np.inf
        self.best_eval = -np.inf
        self.elapsed_before = 0.0  # wall time of earlier launches (resumed runs)
        self.to_target: dict = {}

    # ---- the loop -----------------------------------------------------------------------------
    def run(self) -> dict:
        self.start()
        while self.serving():
            self.turn()
        return self.finish()

    def turn(self) -> None:
        """One turn of the loop (bench/learner_loop.py times it on its own)."""
        now = time.monotonic()
        self.fault.check(now)
        did = self.receive(now)
        did |= self.group.serve(now)
        did |= self.checkpoint(now)
        self.grant_tokens(now)
        self.change_link(now)
        if self.stop_reason is None:
            did |= self.train(now)
            self.evaluate()
            self.decide_stop(now)
        self.send_stop(now)
        self.report(now)
        self.wait(did)

    def serving(self) -> bool:
        """Until every buffer has said DONE and the link has delivered what is queued."""
        return not all(s.done for s in self.sites.values()) or any(
            s.link.backlog for s in self.sites.values()
        )

    @property
    def env_steps(self) -> int:
        return sum(s.steps for s in self.sites.values())

    def start(self) -> None:
        """Continue a checkpoint (--resume), send the first weights (and tokens), then start the
        evaluation runner (after the first weights: off start-up)."""
        if self.resume is not None:
            self.restore(self.resume)
        self.group.start()  # every learner starts from the lead's networks
        self.prog.update(steps=self.env_steps, updates=self.updates, inserted=self.inserted)
        self.send_weights()
        if self.at_learner:
            for s in self.sites.values():
                s.link.post(self.wire.credit(self.cfg.forward_credits), Tag.CREDIT)
        self.eval_runner = make_runner(self.cfg.evaluator, self.cfg, self.spec, self.refset)

    # ---- receive: one handler per message kind ------------------------------------------------
    def receive(self, now: float) -> bool:
        did = False
        for b, site in self.sites.items():
            site.link.poll(now)
            if self.cut.holds(b):
                continue  # its snapshot is taken: what it sent after waits for ours
            msgs = self.cut.unpark(b) + site.link.receive(now)
            did |= bool(msgs)
            rest = self.inbox.deliver(
                self.handlers, msgs, b, now, until=lambda b=b: self.cut.holds(b)
            )
            if rest:  # its acknowledgement came: what it sent after waits for our snapshot
                self.cut.park(b, rest)
        return did

    def on_batch(self, m: Batch) -> None:
        """replay_at=buffer: a sampled batch, trained in fair order (`next_batch`)."""
        if self.stop_reason is None:
            self.sites[m.rank].ready.append((m, m.nbytes, m.t, m.buf))

    def on_forward(self, m: Forward) -> None:
        """replay_at=learner: forwarded experiences into the memory here; a token is owed."""
        site, buf = self.sites[m.rank], m.buf
        cfg, records, frames = self.cfg, m.arrays["records"], m.arrays.get("frames")
        pr = (m.arrays["td_abs"] + cfg.priority_eps) ** cfg.alpha
        self.logs["transfers"].append(
            buffer=site.index,
            update=self.updates,
            kind=int(Tag.FORWARD),
            n=m.n,
            nbytes=buf.nbytes,
            raw_nbytes=m.raw_nbytes or buf.nbytes,
            priority_mean=small_mean(pr),
            priority_td_mean=small_mean(td_units(pr, cfg.alpha)),
            **spread(pr),
            **self.arrival_stats(self.arrival_td(records, frames)),
            window=0,
        )
        if not self.group.insert(records, m.arrays["td_abs"], frames, buf):  # a shard elsewhere
            self.memory.add(records, m.arrays["td_abs"], frames)
        self.inserted += m.n
        site.served += m.n
        site.owed += 1

    def on_stats(self, m: Stats) -> None:
        self.sites[m.rank].steps = m.env_steps
        self.recent.extend(m.arrays["returns"].tolist())
        self.sync.observe_lag(self.updates - m.weights_updates)

    def on_keyframe(self, m: Keyframe) -> None:
        """A delta did not apply at the site: its next broadcast is a full keyframe."""
        self.sync.request_keyframe(m.rank)

    def on_done(self, m: Done) -> None:
        site = self.sites[m.rank]
        site.steps = m.env_steps
        site.done = True
        site.link.drop_latest()  # weights waiting to go: the buffer leaves after our DONE
        site.link.post(self.wire.done(0, 0), Tag.DONE)

    def on_checkpoint(self, m: Checkpoint) -> None:
        """A buffer's acknowledgement: its part (and its actors') is on disk."""
        site = self.sites[m.rank]
        if not self.cut.acknowledge(site.rank, m.id, m.env_steps):
            raise RuntimeError(f"learner: unexpected CHECKPOINT from buffer {site.index}")
        site.steps = m.env_steps

    # ---- checkpoint ---------------------------------------------------------------------------
    def checkpoint(self, now: float) -> bool:
        """Write the learner's part and the manifest once every buffer has acknowledged; start a
        periodic checkpoint when one is due."""
        cut = self.cut
        if cut.complete:
            t_acks = time.monotonic()
            self.save(cut.id, "periodic")
            self.say(
                f"mpirl: checkpoint {cut.id} written in {time.monotonic() - cut.t0:.2f} s "
                f"(every part acknowledged after {t_acks - cut.t0:.2f} s; "
                f"{self.updates:,} updates, {self.env_steps:,} env steps)"
            )
            cut.end(time.monotonic())
            return True
        if (err := cut.overdue(now)) is not None:
            raise RuntimeError(err)
        if cut.due(now, stopping=self.stop_reason is not None):
            cid = cut.begin(now)
            for s in self.sites.values():
                s.link.post(self.wire.checkpoint(cid), Tag.CHECKPOINT, now)
        return False

    def save(self, cid: int, reason: str) -> None:
        """The learner's part of checkpoint ``cid``, then the manifest (last)."""
        sites = self.sites.values()
        meta = {
            "updates": self.updates,
            "weights_version": self.weights_version,
            "inserted": self.inserted,
            "sampled": self.sampled,
            "served": {str(s.index): s.served for s in sites},
            "site_steps": {str(s.index): s.steps for s in sites},
            "best_eval": self.best_eval,
            "last_eval": self.last_eval,
            "eval_round": self.eval_round,
            "beta": self.beta,
            "wall_s_total": self.elapsed_before + time.monotonic() - self.t_start,
            "to_target": self.to_target,
            "online_sha256": params_sha256(self.trainer.online.state_dict()),
            "target_sha256": params_sha256(self.trainer.target.state_dict()),
        }
        arrays = None
        if self.memory is not None:
            arrays, meta["replay"] = memory_state(self.memory)
        self.group.checkpoint(cid, CKPT_TIMEOUT_S)  # the other learners' parts
        t = self.trainer
        self.ckpt.write(
            cid,
            meta,
            arrays,
            {
                "online": t.online.state_dict(),
                "target": t.target.state_dict(),
                "optimizer": t.opt.state_dict(),
                "torch_rng": self.torch.get_rng_state(),
            },
        )
        self.ckpt.manifest(
            cid,
            self.part_names,
            reason,
            {
                "updates": self.updates,
                "env_steps": self.env_steps,
                "inserted": self.inserted,
                "sampled": self.sampled,
                "best_eval": self.best_eval,
            },
        )

    def restore(self, part) -> None:
        """Continue where checkpoint ``part`` left off."""
        ts, r, t = part.torch, part.meta, self.trainer
        t.online.load_state_dict(ts["online"])
        t.target.load_state_dict(ts["target"])
        t.opt.load_state_dict(ts["optimizer"])
        self.torch.set_rng_state(ts["torch_rng"])
        self.log.set_attrs(
            resumed_online_sha256=params_sha256(t.online.state_dict()),
            resumed_target_sha256=params_sha256(t.target.state_dict()),
        )
        self.updates, self.weights_version = r["updates"], r["weights_version"]
        t.updates = self.updates  # the target copy cadence continues
        self.inserted, self.sampled = r["inserted"], r["sampled"]
        self.best_eval, self.last_eval = float(r["best_eval"]), float(r["last_eval"])
        self.eval_round = r["eval_round"]
        for s in self.sites.values():
            s.served = r["served"][str(s.index)]
            s.steps = r["site_steps"][str(s.index)]
        self.elapsed_before, self.to_target = r["wall_s_total"], r["to_target"]
        if self.memory is not None:
            restore_memory(self.memory, part.arrays, r["replay"])
        self.beta = beta_at(self.cfg, self.updates)

    # ---- tokens and the link ------------------------------------------------------------------
    def grant_tokens(self, now: float) -> None:
        """replay_at=learner: give back forward tokens, the site furthest behind its share first,
        while the learner samples ``replay_ratio`` transitions per insert."""
        if not self.at_learner:
            return
        cfg = self.cfg
        for s in sorted(self.sites.values(), key=Site.share):
            limit_ok = (
                cfg.replay_ratio == 0
                or self.stop_reason is not None
                or self.inserted <= cfg.learning_starts + self.sampled / cfg.replay_ratio
            )
            if s.owed and limit_ok and not s.done:  # after its DONE it has left
                s.link.post(self.wire.credit(s.owed), Tag.CREDIT, now)
                s.owed = 0

    def change_link(self, now: float) -> None:
        """--link-change: the link profile changes once, at its time."""
        if self.change is not None and now - self.t_start >= self.change[0]:
            for s in self.sites.values():
                s.link.set_profile(PROFILES[self.change[1]])
            self.change = None

    def send_weights(self, now: float | None = None) -> None:
        """WEIGHTS to every buffer (relayed to its actors), latest-wins on each link, encoded by
        `WeightSync`; off the device once per broadcast."""
        self.weights_version += 1
        self.flat = (self.updates, self.trainer.online.flat_params())
        self.sync.broadcast(
            self.flat[1],
            self.weights_version,
            self.updates,
            time.monotonic() if now is None else now,
        )

    # ---- train --------------------------------------------------------------------------------
    def train(self, now: float) -> bool:
        """One update on the next batch unless the budget or the --learner-updates-per-s cap
        holds it; its priorities go where the memory is.  True when it trained."""
        cfg = self.cfg
        self.beta = beta_at(cfg, self.updates)
        if self.staged is None:
            self.staged = self.next_batch()
        go = (
            self.staged is not None
            and self.group.ready()
            and not (cfg.max_updates and self.updates >= cfg.max_updates)
        )
        held = go and self.cap is not None and not self.cap.try_take(now)
        if self.t_turn is not None:  # the cap held the batch from the last turn until now
            self.capped_s += now - self.t_turn
        self.t_turn, go = (now, False) if held else (None, go)
        if not go:
            return False
        source, batch = self.staged
        before = self.updates
        self.group.before_update()
        if self.at_learner:
            td, _ = self.update(batch)
            self.memory.update(source.indices, source.generations, td)
        else:
            self.train_site_batch(source, batch)
        if self.updates != before:
            self.applied()
        return True

    def applied(self) -> None:
        """After an update (here or in the learner group): the weight broadcast when the
        weight-sync policy says it is due (mpirl.transport.weight_sync)."""
        t = time.monotonic()
        if self.sync.due(self.updates, t):
            self.send_weights(t)

    def train_site_batch(self, source, batch) -> None:
        """replay_at=buffer: train a site's batch, send its priorities back, log the transfer."""
        td, spent = self.update(batch)
        self.post_priorities(source, td, spent)

    def post_priorities(self, source, td: np.ndarray, spent: float) -> None:
        """A site's batch was trained (here, or by another learner of the group, ``spent``
        seconds): its priorities back to its buffer, the transfer's row."""
        site, m, nbytes, arrived = source
        t_done = time.monotonic()
        spent /= self.group.k  # K learners serve K batches at a time: the time per batch
        self.step_s = spent if self.step_s is None else 0.9 * self.step_s + 0.1 * spent
        site.link.post(
            self.wire.priorities(
                m.arrays["indices"],
                m.arrays["generations"],
                td,
                m.batch_id,
                m.t_send,
                hold=t_done - arrived,
                step=self.step_s,
                updates=self.updates,
            ),
            Tag.PRIORITIES,
        )
        pick = self.arrival_pick(len(td))  # the batch's own |td|: no extra forward pass
        self.rows.batch(
            site.index,
            self.updates,
            m.n,
            nbytes,
            m.raw_nbytes or nbytes,
            int(m.arrays["window"][0]),
            m.arrays["priorities"],
            None if pick is None else td if len(pick) == len(td) else td[pick],
        )
        self.sampled += m.n

    def next_batch(self):
        """The next batch, picked and put on its way to the device: (source, device batch), or
        None.  Source: the sample (replay_at=learner) or (site, BATCH message, bytes, arrival
        time)."""
        cfg = self.cfg
        if self.at_learner:
            memory = self.memory
            if len(memory) < max(self.group.learning_starts, 1) or not self.may_sample():
                return None
            memory.beta = self.beta
            s = memory.sample(cfg.batch_size)
            self.sampled += cfg.batch_size
            source, records, weights, frames = s, s.records, s.weights, s.frames
        else:
            got = self.take_site_batch()
            if got is None:
                return None
            source, scale, _ = got
            m = source[1]
            records, weights, frames = (
                m.arrays["records"],
                m.arrays["weights"],
                m.arrays.get("frames"),
            )
            if scale != 1.0:
                weights = weights * np.float32(scale)
        t0 = time.monotonic()
        batch = self.trainer.put(records, weights, frames)
        self.busy += time.monotonic() - t0
        return source, batch

    def may_sample(self) -> bool:
        """replay_at=learner: whether --replay-ratio lets the learner(s) sample another batch
        (the ratio holds sampling too; credits hold inserts)."""
        cfg = self.cfg
        return not (
            cfg.replay_ratio
            and self.sampled > cfg.replay_ratio * (self.inserted - cfg.learning_starts)
        )

    def take_site_batch(self):
        """replay_at=buffer: the next site's batch in weighted fair order, or None:
        ``((site, BATCH message, bytes, arrival), importance-weight scale, raw message)``."""
        waiting = [s for s in self.sites.values() if s.ready]
        if not waiting:
            return None
        site = min(waiting, key=Site.share)  # weighted fair queueing
        m, nbytes, arrived, buf = site.ready.popleft()
        site.served += 1
        site.max_weight = m.max_weight  # the normaliser this batch was sampled with
        top = max(s.max_weight for s in self.sites.values())
        # one scale for every site: the global largest weight is 1 (design.md)
        scale = float(m.max_weight / top) if m.max_weight < top else 1.0
        return (site, m, nbytes, arrived), scale, buf

    def update(self, batch) -> tuple[np.ndarray, float]:
        """One DQN update on ``batch``; while it runs (on CUDA) the next batch is put on its
        way (prefetch).  Returns |td| per sample (the new priorities' raw material) and the
        seconds the learner spent on it."""
        t0 = time.monotonic()
        pending = self.trainer.launch(batch)  # copies the target on its cadence
        t1 = time.monotonic()
        self.staged = self.next_batch()
        t2 = time.monotonic()
        loss, td = pending.result()
        self.updates = self.trainer.updates
        t3 = time.monotonic()
        if not self.group.logs_updates:  # async / gba: the group logs each applied update
            self.rows.update(self.updates, loss, td, self.beta)
            self.loss_sum += loss
            self.loss_n += 1
        self.group.after_update(loss, td)
        spent = (t1 - t0) + (t3 - t2)
        self.busy += spent
        return td, spent

    def arrival_pick(self, n: int) -> np.ndarray | None:
        """Which of a message's n transitions enter the arrival |td| statistic: a uniform random
        subsample of min(n, --arrival-sample), in both placements (None: --arrival-sample 0)."""
        k = min(n, self.cfg.arrival_sample)
        if k == 0:
            return None
        return np.arange(n) if k == n else np.sort(self.arrival_rng.choice(n, k, replace=False))

    def arrival_td(self, records, frames=None) -> np.ndarray | None:
        """|td| of a forwarded message's subsample under the current networks: one forward pass
        over at most --arrival-sample transitions, whatever the chunk size."""
        pick = self.arrival_pick(len(records))
        return None if pick is None else self.trainer.td(records[pick], frames)

    def arrival_stats(self, td: np.ndarray | None) -> dict:
        if td is None:
            return {"arrival_td_mean": np.nan, "arrival_priority_mean": np.nan, "arrival_n": 0}
        cfg = self.cfg
        return {
            "arrival_td_mean": small_mean(td),
            "arrival_priority_mean": small_mean((td + cfg.priority_eps) ** cfg.alpha),
            "arrival_n": td.size,
        }

    # ---- evaluate and stop --------------------------------------------------------------------
    def evaluate(self) -> None:
        """Hand the runner the weights of the last broadcast (or the current ones) when an
        evaluation is due; handle a finished one."""
        runner = self.eval_runner
        if (
            self.updates
            and self.updates - self.last_eval >= self.cfg.eval_every
            and not runner.busy
        ):
            self.last_eval = self.updates
            weights = (
                self.flat[1] if self.flat[0] == self.updates else self.trainer.online.flat_params()
            )
            runner.request(weights, self.eval_round, self.updates, self.env_steps)
            self.eval_round += 1
        res = runner.poll()
        if res is not None:
            self.evaluated(res)

    def evaluated(self, res) -> None:
        """A finished greedy evaluation (``res``: mpirl.roles.evaluation.EvalResult, whose
        ``params`` are the weights evaluated): its row, the best so far, the target-return stop."""
        rets = res.returns
        self.logs["evals"].append(
            update=res.update,
            env_steps=res.env_steps,
            ret_mean=rets.mean(),
            ret_std=rets.std(),
            ret_min=rets.min(),
            eval_s=res.eval_s,
            lag_updates=self.updates - res.update,
            reference_loss=res.reference_loss,
            reference_td_abs_mean=res.reference_td,
            reference_q_sq_mean=res.reference_q_sq,
        )
        if float(rets.mean()) > self.best_eval:  # the weights evaluated, not today's online net
            best_model.offer(
                self.log.path.parent,
                self.trainer.state_dict_of(res.params),
                rets,
                self.best_eval,
                update=res.update,
                env_steps=res.env_steps,
            )
        self.best_eval = max(self.best_eval, float(rets.mean()))
        if (
            self.target_return is not None
            and rets.mean() >= self.target_return
            and self.stop_reason is None
        ):
            self.stop_reason = "target_return"
            self.to_target = {
                "time_to_target_s": self.elapsed_before + time.monotonic() - self.t_start,
                "env_steps_to_target": res.env_steps,
                "updates_to_target": res.update,
            }

    def decide_stop(self, now: float) -> None:
        """The budgets (env steps, updates, seconds) and SIGTERM / SIGINT."""
        cfg = self.cfg
        if self.stop_reason is not None:
            return
        if cfg.max_env_steps and self.env_steps >= cfg.max_env_steps:
            self.stop_reason = "max_env_steps"
        elif cfg.max_updates and self.updates >= cfg.max_updates:
            self.stop_reason = "max_updates"
        elif cfg.max_seconds and now - self.t_start >= cfg.max_seconds:
            self.stop_reason = "max_seconds"
        elif self.stop_signal is not None and self.stop_signal.requested:
            self.stop_reason = self.stop_signal.requested  # stop cleanly

    def send_stop(self, now: float) -> None:
        """STOP to every buffer once, after any checkpoint in progress; it carries the id of
        the final checkpoint every rank writes before its DONE."""
        if self.stop_reason is None or self.stop_sent or self.cut.in_progress:
            return
        self.final_ckpt = self.cut.final_id()
        self.say(
            f"mpirl: stopping ({self.stop_reason}) after {now - self.t_start:.1f} s, "
            f"{self.env_steps:,} env steps, {self.updates:,} updates, best eval "
            f"{self.best_eval:.1f}"
        )
        for s in self.sites.values():
            s.link.post(self.wire.stop(self.final_ckpt), Tag.STOP, now)
        self.stop_sent = True

    # ---- report and wait ----------------------------------------------------------------------
    def report(self, now: float) -> None:
        """A progress row and line every ``progress_seconds``; /link rows every half flush (and
        a last one at the end); the log's flush."""
        cfg = self.cfg
        if cfg.progress_seconds and now - self.t_prog >= cfg.progress_seconds:
            self.progress_row(now)
        finished = not self.serving()
        if now - self.t_link >= cfg.flush_seconds / 2 or finished:
            for s in self.sites.values():
                lk = s.link
                b_out, m_out, q_s = lk.sent.take()
                b_in, m_in, _ = lk.received.take()
                self.logs["link"].append(
                    buffer=s.index,
                    bytes_in=b_in,
                    msgs_in=m_in,
                    bytes_out=b_out,
                    msgs_out=m_out,
                    queue_s=q_s,
                    interval_s=now - self.t_link,
                    utilization=min(
                        1.0, b_out * 8 / lk.profile.rate_bps / max(now - self.t_link, 1e-9)
                    ),
                )
            self.t_link = now
        self.log.maybe_flush(now)

    def progress_row(self, now: float) -> None:
        cfg, p = self.cfg, self.prog
        dt = now - self.t_prog
        env_steps = self.env_steps
        d_steps = env_steps - p["steps"]
        d_updates = self.updates - p["updates"]
        # from the totals: the /link rows reset the interval counters (take()) every
        # flush_seconds / 2, so those held only the bytes since the last /link row
        link_total = sum(
            s.link.sent.total_bytes + s.link.received.total_bytes for s in self.sites.values()
        )
        row = dict(
            env_steps=env_steps,
            updates=self.updates,
            env_steps_per_s=d_steps / dt,
            updates_per_s=d_updates / dt,
            recent_return=float(np.mean(self.recent)) if self.recent else np.nan,
            loss=self.loss_sum / self.loss_n if self.loss_n else np.nan,
            busy_fraction=(self.busy - p["busy"]) / dt,
            link_bytes_per_s=(link_total - p["link"]) / dt,
            interval_s=dt,
            rho=d_updates * cfg.batch_size / d_steps if d_steps > 0 else np.nan,
            delivered_fraction=(
                (self.inserted - p["inserted"]) / d_steps
                if self.at_learner and d_steps > 0
                else np.nan
            ),
            capped_s=self.capped_s - p["capped"],
            idle_fraction=(self.backoff.idle_s - p["idle"]) / dt,
            rss_bytes=rss_bytes(),
            **self.sync.take(),
        )
        self.logs["progress"].append(**row)
        self.say(
            f"[{now - self.t_start:7.1f}s] env steps {env_steps:>10,} "
            f"({row['env_steps_per_s']:,.0f}/s) | updates {self.updates:>8,} "
            f"({row['updates_per_s']:,.0f}/s, busy {row['busy_fraction']:.0%}) | return "
            f"{row['recent_return']:7.1f} | eval {self.best_eval:7.1f} | loss "
            f"{row['loss']:.4f} | link {row['link_bytes_per_s'] / 1e6:.2f} MB/s | lag "
            f"{row['lag_median']:,.0f}"
        )
        self.t_prog = now
        self.prog = {
            "steps": env_steps,
            "updates": self.updates,
            "inserted": self.inserted,
            "capped": self.capped_s,
            "busy": self.busy,
            "link": link_total,
            "idle": self.backoff.idle_s,
        }
        self.loss_sum, self.loss_n = 0.0, 0

    def wait(self, did: bool) -> None:
        """Yield the core when the turn did nothing, until the link's next departure or the
        cap's next token if one holds a ready batch."""
        if did:
            self.backoff.work()
            return
        wake = [d for d in (s.link.next_departure() for s in self.sites.values()) if d is not None]
        if self.t_turn is not None:  # the cap holds a ready batch: wake when its token is there
            wake.append(self.cap.ready_at())
        self.backoff.idle(until=min(wake, default=None))

    def drain_evaluation(self, timeout: float | None = None) -> None:
        """At the stop, the evaluation still in flight (requested before the stop, its result
        not yet in) is waited for, at most ``timeout`` s (EVAL_DRAIN_S), and handled like any
        other: its /evals row, best.pt if it is the best.  Before the final checkpoint, so that
        the checkpoint's best eval and its /evals row count include it."""
        runner = self.eval_runner
        timeout = EVAL_DRAIN_S if timeout is None else timeout
        end = time.monotonic() + timeout
        while runner.busy:
            res = runner.poll()
            if res is not None:
                self.evaluated(res)
                return
            if time.monotonic() >= end:
                self.say(
                    f"mpirl: the evaluation in flight at the stop did not finish within "
                    f"{timeout:g} s; it is left out of /evals and best.pt"
                )
                return
            time.sleep(0.002)

    def finish(self) -> dict:
        """The evaluation in flight, the final checkpoint (every buffer's DONE says its part is
        on disk), the summary."""
        self.drain_evaluation()
        if self.final_ckpt >= 0:
            t0 = time.monotonic()
            self.save(self.final_ckpt, self.stop_reason)
            self.say(
                f"mpirl: checkpoint {self.final_ckpt} written in "
                f"{time.monotonic() - t0:.2f} s; continue with --resume {self.ckpt.run_dir}"
            )
        self.group.close(CKPT_TIMEOUT_S)  # the other learners stop after the final checkpoint
        wall = time.monotonic() - self.t_start
        links = [s.link for s in self.sites.values()]
        summary = {
            "stop_reason": self.stop_reason,
            "target_return": self.target_return,
            "updates": self.updates,
            "env_steps": self.env_steps,
            "wall_s": wall,
            "wall_s_total": self.elapsed_before + wall,
            "checkpoint": self.final_ckpt if self.final_ckpt >= 0 else None,
            "resumed_from": self.resume.id if self.resume is not None else None,
            "best_eval": self.best_eval,
            "busy_fraction": self.busy / wall,
            "delivered_fraction": (
                self.inserted / self.env_steps if self.at_learner and self.env_steps else None
            ),
            "link_bytes_in": sum(lk.received.total_bytes for lk in links),
            "link_bytes_out": sum(lk.sent.total_bytes for lk in links),
            **self.to_target,
        }
        self.log.set_attrs(**summary)
        self.eval_runner.close()
        return summary
