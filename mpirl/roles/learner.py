"""Learner rank (the cloud): trains the DQN and decides when the run stops.

`Learner.run` is the loop; each turn is a list of named steps, each a method:

    receive        take what every buffer sent; one handler per message kind (the placement's
                   batch source handles FORWARD or BATCH, `mpirl.roles.placements`)
    group          --learners K: the other learners' answers and the global updates they make
                   (`mpirl.roles.group_lead`; K = 1: nothing; async / gba: made by the server
                   thread beside the loop, which holds the group's lock except while it
                   computes its own batch and naps)
    checkpoint     advance the consistent cut (`mpirl.transport.cut.Cut`): start one, write when
                   complete; the manifest once the other learners of a group wrote their parts
    grant_tokens   the placement's tokens toward the buffers
    train          one double-DQN update (`mpirl.agent.train_step.TrainStep`) on the next batch the
                   placement draws; its priorities go back by the same placement
    evaluate       greedy evaluation off the update loop (``--evaluator``); the best weights
    decide_stop    target return, env-step / update / time budget, SIGTERM
    send_stop      STOP to every buffer, once, after any checkpoint in progress
    report         the progress line and /progress, /link rows
    wait           yield the core when the turn did nothing

Stop protocol: the learner sends STOP to every buffer and keeps serving the link until each
buffer answers DONE (it has collected DONE from its actors and handed everything over), then
acknowledges with DONE.  No rank is left waiting; every file is closed.

Its parts are built and handed in by `mpirl.wiring.build_learner`; checkpoints (its part: the
networks, optimizer, counters, RNG states and the placement's memory here, if any) are
`mpirl.roles.learner_parts.LearnerCheckpoint`.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from mpirl.replay.build import beta_at
from mpirl.transport.link import PROFILES
from mpirl.transport.wire import Tag

if TYPE_CHECKING:
    from collections.abc import Callable

    from mpirl.agent.train_step import TrainStep
    from mpirl.logs.runlog import RunLog
    from mpirl.roles.group_lead import Applied, Group
    from mpirl.roles.learner_parts import Evaluation, LearnerCheckpoint, Report
    from mpirl.roles.learner_rows import HeldRows
    from mpirl.roles.learner_state import LearnerState
    from mpirl.roles.placements.common import BatchSource, Drawn, Site
    from mpirl.run.checkpoint import Part
    from mpirl.run.config import Config
    from mpirl.run.failure import StopSignal
    from mpirl.transport.cut import Cut
    from mpirl.transport.inbox import Inbox
    from mpirl.transport.pacing import TokenBucket
    from mpirl.transport.waiting import Backoff
    from mpirl.transport.weight_sync import WeightSync
    from mpirl.transport.wire import Checkpoint, Done, Keyframe, Stats, Wire

#: a checkpoint not acknowledged by every buffer by then aborts the job (the other learners of a
#: group have no such limit: the lead does not wait for their parts, `LearnerCheckpoint.commit`)
CKPT_TIMEOUT_S = 120.0


@dataclass
class LearnerParts:
    """What the wiring hands the learner (`mpirl.wiring.build_learner`)."""

    cfg: Config
    wire: Wire
    log: RunLog
    sites: dict[int, Site]  # link rank -> the learner's record of that buffer
    inbox: Inbox
    trainer: TrainStep
    source: BatchSource  # the placement: where batches come from, where priorities go
    group: Group
    weights: WeightSync  # when and how weights are broadcast
    evaluation: Evaluation
    checkpoints: LearnerCheckpoint
    cut: Cut
    report: Report
    rows: HeldRows
    state: LearnerState
    backoff: Backoff
    fault: Any
    cap: TokenBucket | None = None  # --learner-updates-per-s: a token per update
    resume: Part | None = None
    stop_signal: StopSignal | None = None
    say: Callable[[str], None] = print


class Learner:
    """The learner rank's loop; ``run()`` returns the run's summary (summary.json)."""

    def __init__(self, parts: LearnerParts) -> None:
        p = self.parts = parts
        self.cfg, self.wire, self.log, self.sites, self.inbox = (
            p.cfg,
            p.wire,
            p.log,
            p.sites,
            p.inbox,
        )
        self.trainer, self.source, self.group, self.weights = (
            p.trainer,
            p.source,
            p.group,
            p.weights,
        )
        self.evaluation, self.checkpoints, self.cut, self.report = (
            p.evaluation,
            p.checkpoints,
            p.cut,
            p.report,
        )
        self.rows, self.state, self.backoff, self.cap = p.rows, p.state, p.backoff, p.cap
        self.say, self.change = p.say, p.cfg.link_change_at()
        self.handlers: dict[Tag, Callable[[Any], None]] = {
            Tag.STATS: self.on_stats,
            Tag.DONE: self.on_done,
            Tag.CHECKPOINT: self.on_checkpoint,
            Tag.KEYFRAME: self.on_keyframe,
            **p.source.handlers,
        }
        self.staged: tuple[Drawn, tuple[Any, ...]] | None = None  # the next batch, on its way

    # ---- the loop -----------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        """The loop holds the learner group's state (`Group.hold`; the server thread of GBA
        takes it while the loop computes its own batch or naps)."""
        with self.group.hold():
            self.start()
            while self.serving():
                self.turn()
            return self.finish()

    def turn(self) -> None:
        """One turn of the loop (bench/learner_loop.py times it on its own)."""
        now = time.monotonic()
        self.parts.fault.check(now)
        did = self.receive(now)
        did |= self.serve_group(now)
        did |= self.checkpoint(now)
        self.source.grant_tokens(now, self.state.stop_reason is not None)
        self.change_link(now)
        if self.state.stop_reason is None:
            did |= self.train(now)
            self.evaluate()
            self.decide_stop(now)
        self.send_stop(now)
        self.report_rows(now)
        self.wait(did)

    def serving(self) -> bool:
        """Until every buffer has said DONE and the link has delivered what is queued."""
        return not all(s.done for s in self.sites.values()) or any(
            s.link.backlog for s in self.sites.values()
        )

    @property
    def updates(self) -> int:
        return self.state.updates

    def start(self) -> None:
        """Continue a checkpoint (--resume), send the first weights (and tokens), then start the
        evaluation runner (after the first weights: off start-up)."""
        p = self.parts
        if p.resume is not None:
            self.checkpoints.restore(
                p.resume, self.cfg, self.state, self.evaluation, self.sites, self.source, self.group
            )
        self.group.start(self.state.updates)  # every learner starts from the lead's networks
        self.report.mark(self.state)
        self.send_weights()
        self.source.start(time.monotonic())
        self.evaluation.start()

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
                self.handlers, msgs, b, now, until=functools.partial(self.cut.holds, b)
            )
            if rest:  # its acknowledgement came: what it sent after waits for our snapshot
                self.cut.park(b, rest)
        return did

    def on_stats(self, m: Stats) -> None:
        """A site's env steps and returns; the policy lag of each of its actors."""
        site = self.sites[m.rank]
        site.steps = m.env_steps
        self.report.recent.extend(m.returns.tolist())
        actors, acting = m.acting
        lags = self.state.updates - acting
        self.weights.observe_lags(lags)
        self.report.lags(site.index, actors, lags)

    def on_keyframe(self, m: Keyframe) -> None:
        """A delta did not apply at the site: its next broadcast is a full keyframe."""
        self.weights.request_keyframe(m.rank, m.version)

    def on_done(self, m: Done) -> None:
        site = self.sites[m.rank]
        site.steps = m.env_steps
        site.done = True
        site.link.drop_latest()  # weights waiting to go: the buffer leaves after our DONE
        site.link.post(self.wire.done(0, 0))

    def on_checkpoint(self, m: Checkpoint) -> None:
        """A buffer's acknowledgement: its part (and its actors') is on disk."""
        site = self.sites[m.rank]
        if not self.cut.acknowledge(site.rank, m.id, m.env_steps):
            raise RuntimeError(f"learner: unexpected CHECKPOINT from buffer {site.index}")
        site.steps = m.env_steps

    def serve_group(self, now: float) -> bool:
        """--learners K: the other learners' replies; each global update they made is logged
        and may trigger a weight broadcast."""
        applied = self.group.serve(now, self.state)
        for a in applied:
            self.count_update(a)
        return bool(applied)

    # ---- checkpoint ---------------------------------------------------------------------------
    def checkpoint(self, now: float) -> bool:
        """The manifest of a checkpoint whose parts are all in (the other learners of a group
        write theirs when they reach the request: the lead never waits for them); the learner's
        part once every buffer has acknowledged; a periodic checkpoint when one is due and none
        waits for the other learners (a slow learner spaces the checkpoints out, nothing else)."""
        cut = self.cut
        did = self.commit()
        if cut.complete:
            self.save(cut.id, "periodic", cut.t0)
            cut.end(time.monotonic())
            return True
        if (err := cut.overdue(now)) is not None:
            raise RuntimeError(err)
        stopping = self.state.stop_reason is not None
        if cut.due(now, stopping=stopping) and not self.checkpoints.pending:
            cid = cut.begin(now)
            for s in self.sites.values():
                s.link.post(self.wire.checkpoint(cid), now=now)
        return did

    def save(self, cid: int, reason: str, t0: float | None = None) -> None:
        """The learner's part of checkpoint ``cid`` (started at ``t0``, default now), the other
        learners asked for theirs; its manifest at once if every part is in (no group)."""
        t0 = time.monotonic() if t0 is None else t0
        self.checkpoints.save(
            cid, reason, self.state, self.evaluation, self.sites, self.source, self.group, t0
        )
        self.commit()

    def commit(self) -> bool:
        """The manifests of the checkpoints whose parts are all in, each said in a line."""
        done = self.checkpoints.commit(self.group)
        for p in done:
            now, c = time.monotonic(), p.counters
            line = (
                f"mpirl: checkpoint {p.id} written in {now - p.t0:.2f} s (the buffers' and the "
                f"learner's parts after {p.t_part - p.t0:.2f} s; {c['updates']:,} updates, "
                f"{c['env_steps']:,} env steps)"
            )
            if p.id == self.state.final_ckpt:
                assert self.checkpoints.ckpt is not None  # a final checkpoint: a run that saves
                line += f"; continue with --resume {self.checkpoints.ckpt.run_dir}"
            self.say(line)
        return bool(done)

    # ---- the link -----------------------------------------------------------------------------
    def change_link(self, now: float) -> None:
        """--link-change: the link profile changes once, at its time."""
        if self.change is not None and now - self.state.t_start >= self.change[0]:
            for s in self.sites.values():
                s.link.set_profile(PROFILES[self.change[1]])
            self.change = None

    def send_weights(self, now: float | None = None) -> None:
        """WEIGHTS to every buffer (relayed to its actors), latest-wins on each link, encoded by
        `WeightSync`; off the device once per broadcast."""
        st = self.state
        st.weights_version += 1
        st.broadcast = (st.updates, self.trainer.online.flat_params())
        self.weights.broadcast(
            st.broadcast[1],
            st.weights_version,
            st.updates,
            time.monotonic() if now is None else now,
        )

    # ---- train --------------------------------------------------------------------------------
    def train(self, now: float) -> bool:
        """One update on the next batch unless the budget or the --learner-updates-per-s cap
        holds it; its priorities go back by the placement that drew it.  True when it trained."""
        cfg, st = self.cfg, self.state
        st.beta = beta_at(cfg, st.updates)
        if self.staged is None:
            self.staged = self.next_batch()
        go = (
            self.staged is not None
            and self.group.ready()
            and not (cfg.max_updates and st.updates >= cfg.max_updates)
        )
        held = go and self.cap is not None and not self.cap.try_take(now)
        if st.t_turn is not None:  # the cap held the batch from the last turn until now
            st.capped_s += now - st.t_turn
        st.t_turn, go = (now, False) if held else (None, go)
        if not go or self.staged is None:
            return False
        drawn, batch = self.staged
        before = st.updates
        self.group.before_update(st)
        td, spent = self.update(batch, drawn)
        self.source.trained(drawn, td, spent, st.updates)
        if st.updates != before:
            self.after_applied()
        return True

    def next_batch(self) -> tuple[Drawn, tuple[Any, ...]] | None:
        """The next batch the placement draws, put on its way to the device."""
        drawn = self.source.draw(self.state.beta)
        if drawn is None or drawn.records is None:
            return None
        assert drawn.weights is not None  # drawn with its records
        t0 = time.monotonic()
        batch = self.trainer.put(drawn.records, drawn.weights, drawn.frames)
        self.state.busy += time.monotonic() - t0
        return drawn, batch

    def update(self, batch: tuple[Any, ...], drawn: Drawn) -> tuple[np.ndarray, float]:
        """One DQN update on ``batch`` (of ``drawn``); while it runs (on CUDA) the next batch is
        put on its way (prefetch).  Returns |td| per sample and the seconds spent on it."""
        t, group = self.group.compute_step(self.trainer), self.group  # GBA: the lead's copy
        with group.let_go():  # the server thread serves the others meanwhile
            t0, cpu0 = time.monotonic(), time.thread_time()
            pending = t.launch(batch)  # copies the target on its cadence
            t1, cpu1 = time.monotonic(), time.thread_time()
        self.staged = self.next_batch()
        with group.let_go():
            t2 = time.monotonic()
            loss, td = pending.result()
            t3 = time.monotonic()
        if not group.logs_updates:  # async / gba: the group's global updates are counted
            self.state.updates = self.trainer.updates
            self.count_update(None, loss, td, drawn.drawn_as)
        spent = (t1 - t0) + (t3 - t2)
        sync = t.sync
        waited = sync.wait_s if sync is not None else 0.0
        slept = sync.slept_s if sync is not None else 0.0
        compute = spent - waited
        if t is not self.trainer:  # GBA's server thread runs beside the lead's compute
            # the switch rule compares compute times as all-reduce would see them, without the
            # thread: the lead's time off the CPU here (not asleep for --straggle) was its wait
            # for the GIL the thread held and for the core it took, so its CPU time and its
            # sleep stand for it (measured at load 4-5: 1.8-2.8 ms a batch of wall time,
            # 0.8-0.9 ms on the CPU, the other learner 0.7-0.8 ms of wall time)
            compute = (cpu1 - cpu0) + slept + (t3 - t2)
        group.after_update(self.state.updates, loss, td, compute)
        self.state.busy += spent
        return td, spent

    def count_update(
        self,
        applied: Applied | None,
        loss: float = 0.0,
        td: np.ndarray | None = None,
        drawn_as: np.ndarray | None = None,
    ) -> None:
        """An update's /updates row and the progress loss (``applied``: one the group made)."""
        st = self.state
        if applied is not None:
            st.updates, loss, td = applied.update, applied.loss, applied.td
            self.after_applied()
        assert td is not None
        self.rows.update(st.updates, loss, td, st.beta, drawn_as)
        st.loss_sum += loss
        st.loss_n += 1

    def after_applied(self) -> None:
        """After an update: the weight broadcast when the weight-sync policy says it is due."""
        t = time.monotonic()
        if self.weights.due(self.state.updates, t):
            self.send_weights(t)

    # ---- evaluate and stop --------------------------------------------------------------------
    def evaluate(self) -> None:
        """The evaluation of the last broadcast's weights (or the current ones) when due."""
        st = self.state

        def weights() -> np.ndarray:
            b = st.broadcast
            return (
                b[1]
                if b[0] == st.updates and b[1] is not None
                else self.trainer.online.flat_params()
            )

        self.reached(self.evaluation.step(st.updates, self.report.env_steps(), weights))

    def reached(self, at: dict[str, float] | None) -> None:
        """An evaluation reached the target return: the stop, and when it was reached."""
        st = self.state
        if at is not None and st.stop_reason is None:
            st.stop_reason = "target_return"
            st.to_target = {"time_to_target_s": st.wall_total(), **at}

    def decide_stop(self, now: float) -> None:
        """The budgets (env steps, updates, seconds) and SIGTERM / SIGINT."""
        cfg, st = self.cfg, self.state
        if st.stop_reason is not None:
            return
        if cfg.max_env_steps and self.report.env_steps() >= cfg.max_env_steps:
            st.stop_reason = "max_env_steps"
        elif cfg.max_updates and st.updates >= cfg.max_updates:
            st.stop_reason = "max_updates"
        elif cfg.max_seconds and now - st.t_start >= cfg.max_seconds:
            st.stop_reason = "max_seconds"
        elif self.parts.stop_signal is not None and self.parts.stop_signal.requested:
            st.stop_reason = self.parts.stop_signal.requested  # stop cleanly

    def send_stop(self, now: float) -> None:
        """STOP to every buffer once, after any checkpoint in progress; it carries the id of
        the final checkpoint every rank writes before its DONE."""
        st = self.state
        if st.stop_reason is None or st.stop_sent or self.cut.in_progress:
            return
        st.final_ckpt = self.cut.final_id()
        self.source.stop()
        self.say(
            f"mpirl: stopping ({st.stop_reason}) after {now - st.t_start:.1f} s, "
            f"{self.report.env_steps():,} env steps, {st.updates:,} updates, best eval "
            f"{self.evaluation.best:.1f}"
        )
        for s in self.sites.values():
            s.link.post(self.wire.stop(st.final_ckpt), now=now)
        st.stop_sent = True

    # ---- report and wait ----------------------------------------------------------------------
    def report_rows(self, now: float) -> None:
        """A progress row and line every ``progress_seconds``; /link rows every half flush (and
        a last one at the end); the log's flush."""
        cfg, report = self.cfg, self.report
        if cfg.progress_seconds and now - report.t_prog >= cfg.progress_seconds:
            report.progress(now, self.state, self.evaluation.best)
        if now - report.t_link >= cfg.flush_seconds / 2 or not self.serving():
            report.link_rows(now)
        self.log.maybe_flush(now)

    def wait(self, did: bool) -> None:
        """Yield the core when the turn did nothing, until the link's next departure or the
        cap's next token if one holds a ready batch."""
        if did:
            self.backoff.work()
            return
        wake = [d for d in (s.link.next_departure() for s in self.sites.values()) if d is not None]
        if self.state.t_turn is not None and self.cap is not None:  # the cap holds a batch
            wake.append(self.cap.ready_at())
        with self.group.let_go():
            self.backoff.idle(until=min(wake, default=None))

    def finish(self) -> dict[str, Any]:
        """The evaluation in flight, the final checkpoint (every buffer's DONE says its part is
        on disk; the other learners' parts are waited for, and every earlier checkpoint's come
        before them), the summary."""
        st = self.state
        self.group.halt()  # GBA's server thread: joined; its last updates counted
        self.serve_group(time.monotonic())
        self.reached(self.evaluation.drain(st.updates))
        if st.final_ckpt >= 0:  # complete before the job ends: the one wait for the group
            self.save(st.final_ckpt, st.stop_reason or "stop")
            self.group.await_written(st.final_ckpt, self.say)
            self.commit()
        self.group.close(CKPT_TIMEOUT_S)  # the other learners stop after the final checkpoint
        resume = self.parts.resume
        summary = self.report.summary(
            st,
            self.evaluation.best,
            self.evaluation.target_return,
            resume.id if resume is not None else None,
        )
        self.log.set_attrs(**summary)
        self.evaluation.close()
        return summary
