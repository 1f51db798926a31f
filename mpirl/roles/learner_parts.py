"""The learner's parts, each handed to `mpirl.roles.learner.Learner` by the wiring
(`mpirl.wiring.build_learner`) beside its counters (`mpirl.roles.learner_state`): the greedy
evaluation and best
model (`Evaluation`), its checkpoint part (`LearnerCheckpoint`) and its reports (`Report`: the
progress line, /progress and /link rows, the summary).  None of them sends a message."""

from __future__ import annotations

import os
import time
from collections import deque
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from mpirl.replay.build import beta_at
from mpirl.roles import best_model
from mpirl.run.checkpoint import params_sha256

if TYPE_CHECKING:
    from collections.abc import Callable

    from mpirl.agent.train_step import TrainStep
    from mpirl.logs.runlog import RunLog, Stream
    from mpirl.roles.evaluation import EvalResult
    from mpirl.roles.group_lead import Group
    from mpirl.roles.learner_state import LearnerState
    from mpirl.roles.placements.common import BatchSource, Site
    from mpirl.run.checkpoint import Checkpointer, Part
    from mpirl.run.config import Config
    from mpirl.transport.waiting import Backoff
    from mpirl.transport.weight_sync import WeightSync

EVAL_DRAIN_S = 15.0  # at the stop, wait this long at most for the evaluation in flight


def rss_bytes() -> int:
    """This process's resident memory now (Linux /proc; -1 where there is none)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return -1


class Evaluation:
    """Greedy evaluation off the update loop (``--evaluator``), the best model (best.pt) and the
    target-return stop."""

    def __init__(
        self,
        cfg: Config,
        make_runner: Callable[[], Any],
        evals: Stream,
        run_dir: Any,
        trainer: TrainStep,
        target_return: float | None,
        say: Callable[[str], None],
    ) -> None:
        self.cfg, self.make_runner, self.evals, self.run_dir = cfg, make_runner, evals, run_dir
        self.trainer, self.target_return, self.say = trainer, target_return, say
        self.runner: Any = None
        self.round = 0
        self.last = -np.inf  # the update count of the last evaluation requested
        self.t_last = time.monotonic()  # and when (--eval-every-s counts from the start)
        self.best = -np.inf

    def start(self) -> None:
        self.runner = self.make_runner()
        self.t_last = time.monotonic()

    def due(self, updates: int, now: float) -> bool:
        """Every --eval-every updates, or every --eval-every-s seconds of wall time (the first
        after that long), once the learner has updated."""
        if not updates:
            return False
        if self.cfg.eval_every_s:
            return now - self.t_last >= self.cfg.eval_every_s
        return updates - self.last >= self.cfg.eval_every

    def step(self, updates: int, env_steps: int, weights: Callable[[], np.ndarray]) -> Any:
        """Hand the runner ``weights()`` when an evaluation is due; a finished one's result is
        handled (`handle`), and what it returns is returned."""
        runner, now = self.runner, time.monotonic()
        if self.due(updates, now) and not runner.busy:
            self.last, self.t_last = updates, now
            runner.request(weights(), self.round, updates, env_steps)
            self.round += 1
        res = runner.poll()
        return None if res is None else self.handle(res, updates)

    def handle(self, res: EvalResult, updates: int) -> dict[str, float] | None:
        """A finished greedy evaluation (``res.params``: the weights evaluated): its row, the
        best so far; ``{"env_steps_to_target", "updates_to_target"}`` when it reached the
        target return."""
        rets = res.returns
        self.evals.append(
            update=res.update,
            env_steps=res.env_steps,
            ret_mean=rets.mean(),
            ret_std=rets.std(),
            ret_min=rets.min(),
            eval_s=res.eval_s,
            lag_updates=updates - res.update,
            reference_loss=res.reference_loss,
            reference_td_abs_mean=res.reference_td,
            reference_q_sq_mean=res.reference_q_sq,
        )
        if float(rets.mean()) > self.best:  # the weights evaluated, not today's online net
            best_model.offer(
                self.run_dir,
                self.trainer.state_dict_of(res.params),
                rets,
                self.best,
                update=res.update,
                env_steps=res.env_steps,
            )
        self.best = max(self.best, float(rets.mean()))
        if self.target_return is not None and rets.mean() >= self.target_return:
            return {"env_steps_to_target": res.env_steps, "updates_to_target": res.update}
        return None

    def drain(self, updates: int, timeout: float = EVAL_DRAIN_S) -> Any:
        """At the stop, the evaluation still in flight is waited for, at most ``timeout`` s, and
        handled like any other (before the final checkpoint, so that it counts there)."""
        runner = self.runner
        end = time.monotonic() + timeout
        while runner.busy:
            res = runner.poll()
            if res is not None:
                return self.handle(res, updates)
            if time.monotonic() >= end:
                self.say(
                    f"mpirl: the evaluation in flight at the stop did not finish within "
                    f"{timeout:g} s; it is left out of /evals and best.pt"
                )
                return None
            time.sleep(0.002)
        return None

    def close(self) -> None:
        self.runner.close()


class Unfinished(NamedTuple):
    """A checkpoint whose learner part is written and whose manifest waits for the other
    learners' parts (``t0``: when it started, ``t_part``: when the lead's part was written)."""

    id: int
    reason: str
    counters: dict[str, Any]
    t0: float
    t_part: float


class LearnerCheckpoint:
    """The learner's part of a checkpoint (networks, optimizer, counters, RNG, the memory of a
    placement that keeps one here) and the manifest, written last, once every other learner of
    the group has written its part too (`commit`): the lead does not wait for them."""

    def __init__(
        self,
        ckpt: Checkpointer | None,
        trainer: TrainStep,
        part_names: list[str],
        log: RunLog,
        torch: Any,
        weights: WeightSync,
    ) -> None:
        self.ckpt, self.trainer, self.part_names, self.log = ckpt, trainer, part_names, log
        self.torch, self.weights = torch, weights
        self.pending: deque[Unfinished] = deque()  # oldest first

    def save(
        self,
        cid: int,
        reason: str,
        state: LearnerState,
        evaluation: Evaluation,
        sites: dict[int, Site],
        source: BatchSource,
        group: Group,
        t0: float,
    ) -> None:
        """Write the learner's part of checkpoint ``cid`` (started at ``t0``) and ask the other
        learners of the group for theirs, without waiting for them: its manifest is written by
        `commit` once they are in (at once without a group)."""
        ss, t = sites.values(), self.trainer
        placed, arrays = source.save()
        meta = {
            "updates": state.updates,
            "weights_version": state.weights_version,
            **placed,
            "served": {str(s.index): s.served for s in ss},
            "site_steps": {str(s.index): s.steps for s in ss},
            "best_eval": evaluation.best,
            "last_eval": evaluation.last,
            "eval_round": evaluation.round,
            "beta": state.beta,
            "wall_s_total": state.wall_total(),
            "to_target": state.to_target,
            "weights_replaced": self.weights.replaced(),
            "online_sha256": params_sha256(t.online.state_dict()),
            "target_sha256": params_sha256(t.target.state_dict()),
        }
        meta |= group.checkpoint(cid)  # asks the other learners for their parts; no wait
        assert self.ckpt is not None  # a cut starts only in a run that saves
        self.ckpt.write(
            cid,
            meta,
            arrays,
            t.checkpoint_tensors(),
        )
        counters = {
            "updates": state.updates,
            "env_steps": sum(s.steps for s in ss),
            "inserted": source.inserted,
            "sampled": source.sampled,
            "best_eval": evaluation.best,
        }
        self.pending.append(Unfinished(cid, reason, counters, t0, time.monotonic()))

    def commit(self, group: Group) -> list[Unfinished]:
        """The manifest of each pending checkpoint whose parts are all written, oldest first
        (the other learners write theirs in the order asked); returns those committed.  Polls:
        never waits."""
        done = []
        while self.pending and group.written(self.pending[0].id):
            p = self.pending.popleft()
            assert self.ckpt is not None  # pending: a run that saves
            self.ckpt.manifest(p.id, self.part_names, p.reason, p.counters)
            done.append(p)
        return done

    def restore(
        self,
        part: Part,
        cfg: Config,
        state: LearnerState,
        evaluation: Evaluation,
        sites: dict[int, Site],
        source: BatchSource,
        group: Group,
    ) -> None:
        """Continue where checkpoint ``part`` left off."""
        ts, r, t = part.torch, part.meta, self.trainer
        assert ts is not None  # a learner's part holds its tensors
        t.online.load_state_dict(ts["online"])
        t.target.load_state_dict(ts["target"])
        t.opt.load_state_dict(ts["optimizer"])
        self.torch.set_rng_state(ts["torch_rng"])
        self.log.set_attrs(
            resumed_online_sha256=params_sha256(t.online.state_dict()),
            resumed_target_sha256=params_sha256(t.target.state_dict()),
        )
        state.updates, state.weights_version = r["updates"], r["weights_version"]
        t.updates = state.updates  # the target copy cadence continues
        evaluation.best, evaluation.last = float(r["best_eval"]), float(r["last_eval"])
        evaluation.round = r["eval_round"]
        for s in sites.values():
            s.served = r["served"][str(s.index)]
            s.steps = r["site_steps"][str(s.index)]
        state.elapsed_before, state.to_target = r["wall_s_total"], r["to_target"]
        self.weights.replaced_before = r.get("weights_replaced", 0)  # a cumulative count
        source.restore(r, part.arrays)
        group.resume(r)
        state.beta = beta_at(cfg, state.updates)


class Report:
    """The progress line and /progress row every ``progress_seconds``, /link rows every half
    flush, and the run's summary."""

    def __init__(
        self,
        cfg: Config,
        streams: dict[str, Stream],
        sites: dict[int, Site],
        source: BatchSource,
        weights: WeightSync,
        backoff: Backoff,
        say: Callable[[str], None],
        t_start: float,
        sync_mode: Callable[[], int] = lambda: 0,
    ) -> None:
        """``sync_mode()``: how the learner group makes updates now (0 synchronous, 1 GBA)."""
        self.cfg, self.streams, self.sites, self.source = cfg, streams, sites, source
        self.sync_mode = sync_mode
        self.weights, self.backoff, self.say = weights, backoff, say
        self.recent: deque[float] = deque(maxlen=100)  # the actors' last episode returns
        self.t_prog = self.t_link = t_start
        self.prog: dict[str, float] = {}  # the totals at the last progress row

    def env_steps(self) -> int:
        return sum(s.steps for s in self.sites.values())

    def link_total(self) -> int:
        return sum(
            s.link.sent.total_bytes + s.link.received.total_bytes for s in self.sites.values()
        )

    def mark(self, state: LearnerState) -> None:
        """The totals the next progress row counts from."""
        self.prog = {
            "steps": self.env_steps(),
            "updates": state.updates,
            "sampled": self.source.sampled,
            "inserted": self.source.delivered() or 0,
            "capped": state.capped_s,
            "busy": state.busy,
            "link": self.link_total(),
            "idle": self.backoff.idle_s,
        }

    def lags(self, site: int, actors: np.ndarray, lags: np.ndarray) -> None:
        """/lag: one row per actor a site's STATS reported on."""
        if len(actors):
            self.streams["lag"].extend(
                buffer=np.full(len(actors), site), actor=actors, lag_updates=lags
            )

    def link_rows(self, now: float) -> None:
        for s in self.sites.values():
            lk = s.link
            b_out, m_out, q_s = lk.sent.take()
            b_in, m_in, _ = lk.received.take()
            self.streams["link"].append(
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

    def progress(self, now: float, state: LearnerState, best_eval: float) -> None:
        p = self.prog
        dt = now - self.t_prog
        env_steps = self.env_steps()
        d_steps = env_steps - p["steps"]
        d_updates = state.updates - p["updates"]
        delivered = self.source.delivered()
        # from the totals: the /link rows reset the interval counters (take()) every
        # flush_seconds / 2, so those held only the bytes since the last /link row
        link_total = self.link_total()
        row = dict(
            env_steps=env_steps,
            updates=state.updates,
            env_steps_per_s=d_steps / dt,
            updates_per_s=d_updates / dt,
            recent_return=float(np.mean(self.recent)) if self.recent else np.nan,
            loss=state.loss_sum / state.loss_n if state.loss_n else np.nan,
            busy_fraction=(state.busy - p["busy"]) / dt,
            link_bytes_per_s=(link_total - p["link"]) / dt,
            interval_s=dt,
            # transitions trained per env step: every learner's batches (K per global update)
            rho=(self.source.sampled - p["sampled"]) / d_steps if d_steps > 0 else np.nan,
            delivered_fraction=(
                (delivered - p["inserted"]) / d_steps
                if delivered is not None and d_steps > 0
                else np.nan
            ),
            sampled=self.source.sampled,
            delivered=-1 if delivered is None else delivered,
            capped_s=state.capped_s - p["capped"],
            idle_fraction=(self.backoff.idle_s - p["idle"]) / dt,
            rss_bytes=rss_bytes(),
            sync_mode=self.sync_mode(),
            **self.weights.take(),
        )
        self.streams["progress"].append(**row)
        self.say(
            f"[{now - state.t_start:7.1f}s] env steps {env_steps:>10,} "
            f"({row['env_steps_per_s']:,.0f}/s) | updates {state.updates:>8,} "
            f"({row['updates_per_s']:,.0f}/s, busy {row['busy_fraction']:.0%}) | return "
            f"{row['recent_return']:7.1f} | eval {best_eval:7.1f} | loss "
            f"{row['loss']:.4f} | link {row['link_bytes_per_s'] / 1e6:.2f} MB/s | lag "
            f"{row['lag_median']:,.0f}{self.mode_text(row['sync_mode'])}"
        )
        self.t_prog = now
        self.mark(state)
        state.loss_sum, state.loss_n = 0.0, 0

    def mode_text(self, sync_mode: int) -> str:
        """--learner-sync switch: the progress line says how updates are made now."""
        if self.cfg.learner_sync != "switch":
            return ""
        return " | gba" if sync_mode else " | sync"

    def summary(
        self, state: LearnerState, best_eval: float, target_return: float | None, resumed: Any
    ) -> dict[str, Any]:
        wall = time.monotonic() - state.t_start
        links = [s.link for s in self.sites.values()]
        env_steps = self.env_steps()
        delivered = self.source.delivered()
        return {
            "stop_reason": state.stop_reason,
            "target_return": target_return,
            "updates": state.updates,
            "env_steps": env_steps,
            "wall_s": wall,
            "wall_s_total": state.elapsed_before + wall,
            "checkpoint": state.final_ckpt if state.final_ckpt >= 0 else None,
            "resumed_from": resumed,
            "best_eval": best_eval,
            "busy_fraction": state.busy / wall,
            "delivered_fraction": (
                delivered / env_steps if delivered is not None and env_steps else None
            ),
            "link_bytes_in": sum(lk.received.total_bytes for lk in links),
            "link_bytes_out": sum(lk.sent.total_bytes for lk in links),
            **state.to_target,
        }
