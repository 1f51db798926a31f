"""Learner rank (the cloud): trains the DQN and decides when the run stops.

Per loop turn: [link] take what every buffer sent (batches or forwarded experiences, stats,
done); [algorithm] one update when there is data: double DQN, Huber loss weighted by importance
weights, gradient clipping, target copy every ``target_update`` updates; [link] the batch's
priority update back to its buffer (replay_at=buffer), tokens for more forwarded experiences
(replay_at=learner, paced so the learner samples ``replay_ratio`` transitions per insert),
weights to every buffer every ``weights_every`` updates; greedy evaluation every ``eval_every``
updates; the stop decision (target return, env-step or time budget) and a progress line.

Stop protocol: the learner sends STOP to every buffer and keeps serving the link until each
buffer answers DONE (it has collected DONE from its actors and handed everything over), then
acknowledges with DONE.  No rank is left waiting; every file is closed.

Checkpoints (``checkpoint_seconds``, and always at a clean stop): the learner sends CHECKPOINT
to every buffer, holds each buffer's later messages once it has acknowledged (its part is on
disk), and when all have, writes its own part (networks, optimizer, counters, RNG states, the
replay memory at the learner) and the manifest last.  A stop waits for a checkpoint in progress;
STOP then carries the id of a final checkpoint that every rank writes before its DONE.
"""

from __future__ import annotations

import copy
import time
from collections import deque

import numpy as np

from mpirl import best_model, failure, seeds
from mpirl.checkpoint import memory_state, part_name, restore_memory
from mpirl.envs import Evaluator
from mpirl.frames import stacks
from mpirl.link import PROFILES, LinkEnd, resolve_profile
from mpirl.logs import Field, RunLog
from mpirl.qnet import make_learner_q, make_q
from mpirl.replay.build import beta_at, make_replay
from mpirl.waiting import Backoff
from mpirl.wire import Tag, Wire


def _batch_tensors(torch, records, frames=None, stack: int = 1):
    """Structured records (possibly an unaligned view of a message) -> torch tensors.

    Image runs: ``obs`` / ``next_obs`` are rebuilt from the frame table and stay uint8 (the
    network casts and scales them)."""
    if frames is not None:
        obs, nxt = (torch.from_numpy(x) for x in stacks(records, frames, stack))
    else:
        obs = torch.from_numpy(np.ascontiguousarray(records["obs"], np.float32))
        nxt = torch.from_numpy(np.ascontiguousarray(records["next_obs"], np.float32))
    return (obs,
            torch.from_numpy(np.ascontiguousarray(records["action"], np.int64)),
            torch.from_numpy(np.ascontiguousarray(records["reward"], np.float32)),
            nxt,
            torch.from_numpy(np.ascontiguousarray(records["discount"], np.float32)))


class TrainStep:
    """The learner's train step, callable on its own (no MPI, no logging; bench/overheads.py
    times it standalone): the online and target networks, Adam, and one update on a batch.

    ``step(records, weights, frames)`` is one double-DQN update (Huber loss weighted by the
    importance weights, gradient clipping) and returns ``(loss, |td| per sample)``; the caller
    counts updates and calls ``sync_target`` every ``target_update`` of them."""

    def __init__(self, cfg, spec):
        import torch

        from mpirl.dqn import Adam, dqn_loss

        self.torch, self.loss_fn = torch, dqn_loss
        self.spec, self.huber_delta, self.grad_clip = spec, cfg.huber_delta, cfg.grad_clip
        self.online = make_learner_q(spec, cfg.hidden, cfg.dueling)
        self.target = copy.deepcopy(self.online)
        self.opt = Adam(self.online.parameters(), lr=cfg.lr)  # torch's kernel, no dynamo import

    def step(self, records, weights, frames=None) -> tuple[float, np.ndarray]:
        torch = self.torch
        obs, act, rew, nxt, disc = _batch_tensors(torch, records, frames, self.spec.stack)
        w = torch.from_numpy(np.ascontiguousarray(weights, np.float32))
        loss, td = self.loss_fn(self.online, self.target, obs, act, rew, nxt, disc, w,
                                self.huber_delta)
        self.opt.zero_grad()
        loss.backward()
        if self.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.online.parameters(), self.grad_clip)
        self.opt.step()
        return float(loss.detach()), td.detach().numpy()

    def sync_target(self) -> None:
        self.target.load_state_dict(self.online.state_dict())


def _mean(x: np.ndarray) -> float:
    """Mean of a small array for a log row: np.mean's dispatch costs ~4x the sum of 64 values,
    and the learner logs four means per update (docs/benchmarks.md, "Component overheads")."""
    return float(np.add.reduce(x, axis=None)) / x.size if x.size else float("nan")


CKPT_TIMEOUT_S = 120.0  # a checkpoint not acknowledged by every buffer by then aborts the job


def checkpoint_timeout_s(cfg, spec) -> float:
    """CKPT_TIMEOUT_S plus the time a healthy buffer may take to write its replay memory
    (``checkpoint.write_allowance_s``): a large memory must not abort a healthy checkpoint."""
    from mpirl.checkpoint import write_allowance_s
    from mpirl.replay.build import replay_footprint

    if cfg.replay_at != "buffer":
        return CKPT_TIMEOUT_S
    return CKPT_TIMEOUT_S + write_allowance_s(replay_footprint(cfg, spec))


def run(cfg, topo, spec, wire: Wire, log: RunLog, say=print, stop_signal=None, ckpt=None,
        resume=None) -> dict:
    import torch

    from mpirl.dqn import dqn_loss

    torch.set_num_threads(cfg.torch_threads)
    seed = seeds.learner(cfg.seed, topo.link.Get_size() - 1)
    torch.manual_seed(seed["torch"])
    profile = resolve_profile(cfg)
    buffers = list(range(1, topo.link.Get_size()))  # link ranks of the buffers
    links = {b: LinkEnd(topo.link, b, profile, seed=seed["link"][b - 1]) for b in buffers}
    trainer = TrainStep(cfg, spec)
    online, target, opt = trainer.online, trainer.target, trainer.opt
    at_learner = cfg.replay_at == "learner"
    memory = make_replay(cfg, spec, wire.record, seed=seed["replay"]) if at_learner else None
    image = spec.image
    evaluator = Evaluator(cfg.env, cfg.eval_episodes, seed=seed["evaluation"],
                          max_steps=cfg.eval_max_steps, kwargs=cfg.env_kwargs,
                          wrappers=cfg.wrapper_specs())
    eval_q = make_q(spec, cfg.hidden, cfg.dueling, threads=None)
    target_return = cfg.target_return if cfg.target_return is not None else spec.reward_threshold
    if target_return is not None and not np.isfinite(target_return):
        target_return = None  # --target-return none
    log.set_attrs(target_return=target_return)

    upd_log = log.stream("updates", [
        Field("update", "i8", "", "update number"),
        Field("loss", "f4", "", "weighted Huber loss of the update"),
        Field("td_abs_mean", "f4", "", "mean |td| of the batch"),
        Field("beta", "f4", "", "importance-weight exponent used"),
    ], doc="one row per learner update")
    xfer_log = log.stream("transfers", [
        Field("buffer", "i4", "", "site of the buffer that sent it"),
        Field("update", "i8", "", "learner updates so far when it was used / arrived"),
        Field("kind", "i4", "", "5 = sampled batch (replay_at=buffer), 4 = forwarded experiences "
              "(replay_at=learner)"),
        Field("n", "i8", "transitions", "experiences in the message"),
        Field("nbytes", "i8", "bytes", "message size on the link"),
        Field("raw_nbytes", "i8", "bytes", "message size before compression (= nbytes when it "
              "was not compressed)"),
        Field("priority_mean", "f4", "", "mean priority the sender held for them: p=(|td|+eps)"
              "^alpha from the buffer's memory, or from the actors' initial |td|"),
        Field("arrival_td_mean", "f4", "", "mean |td| under the learner's current network on "
              "arrival"),
        Field("arrival_priority_mean", "f4", "", "mean (|td|+eps)^alpha of arrival_td"),
        Field("window", "i4", "batches", "the sending buffer's in-flight window when it sent "
              "the batch (replay_at=buffer; 0 for forwarded experiences)"),
    ], doc="every message of experiences that crossed the link toward the learner")
    eval_log = log.stream("evals", [
        Field("update", "i8", "", "learner updates so far"),
        Field("env_steps", "i8", "steps", "env steps of all actors so far"),
        Field("ret_mean", "f8", "reward", "greedy evaluation mean return"),
        Field("ret_std", "f8", "reward", "std of the evaluation returns"),
        Field("ret_min", "f8", "reward", "worst evaluation return"),
    ], doc="greedy evaluations (eval_episodes episodes each)")
    prog_log = log.stream("progress", [
        Field("env_steps", "i8", "steps", "env steps of all actors"),
        Field("updates", "i8", "", "learner updates"),
        Field("env_steps_per_s", "f8", "steps/s", "over the last interval"),
        Field("updates_per_s", "f8", "1/s", "over the last interval"),
        Field("recent_return", "f8", "reward", "mean of the actors' last 100 episode returns"),
        Field("loss", "f8", "", "mean loss over the interval"),
        Field("busy_fraction", "f4", "", "time training / wall time over the interval"),
        Field("link_bytes_per_s", "f8", "bytes/s", "both directions, all buffers"),
        Field("interval_s", "f8", "s", "length of the interval the rates are over"),
    ], doc="one row per progress interval")
    link_log = log.stream("link", [
        Field("buffer", "i4", "", "site"),
        Field("bytes_in", "i8", "bytes", "bytes received from the buffer in the interval"),
        Field("msgs_in", "i8", "messages", "messages received from the buffer"),
        Field("bytes_out", "i8", "bytes", "bytes sent to the buffer"),
        Field("msgs_out", "i8", "messages", "messages sent to the buffer"),
        Field("queue_s", "f8", "s", "summed time messages waited for the modelled bandwidth"),
        Field("interval_s", "f8", "s", "length of the interval"),
        Field("utilization", "f4", "", "fraction of the interval the learner->buffer side was "
              "busy at the modelled bandwidth (0 without emulation)"),
    ], doc="the learner's side of each long-haul link, one row per buffer per interval")

    def to_numpy(t):
        return t.detach().numpy()

    def train(records, weights, frames=None) -> np.ndarray:
        """One DQN update; returns |td| per sample (the new priorities' raw material)."""
        nonlocal updates, busy, loss_sum, loss_n
        t0 = time.monotonic()
        lv, td_np = trainer.step(records, weights, frames)
        updates += 1
        if updates % cfg.target_update == 0:
            trainer.sync_target()
        upd_log.append(update=updates, loss=lv, td_abs_mean=_mean(td_np), beta=beta)
        loss_sum += lv
        loss_n += 1
        busy += time.monotonic() - t0
        return td_np

    def arrival_td(records, frames=None) -> np.ndarray:
        if image and len(records) > cfg.batch_size:  # a CNN pass over a whole forwarded chunk
            records = records[:: -(-len(records) // cfg.batch_size)]  # costs seconds: subsample
        with torch.no_grad():
            obs, act, rew, nxt, disc = _batch_tensors(torch, records, frames, spec.stack)
            _, td = dqn_loss(online, target, obs, act, rew, nxt, disc, torch.ones(len(act)))
        return to_numpy(td)

    def send_weights() -> None:
        nonlocal weights_version
        weights_version += 1
        buf = wire.weights(online.flat_params(), weights_version, updates)
        for b in buffers:
            links[b].post(buf, Tag.WEIGHTS)

    def beta_now() -> float:
        return beta_at(cfg, updates)

    backoff = Backoff()
    updates = weights_version = -1
    updates = 0
    busy = 0.0
    loss_sum, loss_n = 0.0, 0
    beta = cfg.beta
    site_steps = {b: 0 for b in buffers}
    recent = deque(maxlen=100)
    ready = {b: deque() for b in buffers}  # per site: sampled batches waiting to be trained on
    max_w = {b: 0.0 for b in buffers}  # per site: its memory's max weight, as last reported
    weight = {b: (cfg.site_weights[b - 1] if cfg.site_weights else 1.0) for b in buffers}
    served = {b: 0 for b in buffers}  # batches trained (replay_at=buffer) / inserted (learner)
    owed = {b: 0 for b in buffers}  # forward tokens to give back (replay_at=learner)
    inserted = sampled = 0
    last_eval = -np.inf
    best_eval = -np.inf
    stop_reason = None
    done = set()
    t_start = time.monotonic()
    t_prog = t_link = t_start
    log.set_attrs(loop_start_t=log.elapsed())  # the summary's clock on the log's clock
    prog_steps = prog_updates = 0
    prog_busy = 0.0
    prog_link = 0  # link bytes (both directions, all buffers) at the last progress row
    to_target: dict = {}
    step_s = None
    change = cfg.link_change_at()

    fault = failure.FAULT
    elapsed_before = 0.0  # wall time of earlier launches (resumed runs)
    ckpt_next = ckpt.next_id() if ckpt is not None else 1
    ckpt_id, ckpt_t0, t_ckpt = -1, 0.0, t_start  # checkpoint in progress, its start, last end
    ckpt_timeout = checkpoint_timeout_s(cfg, spec)
    ckpt_acked: dict[int, int] = {}  # buffer -> its env steps at its snapshot
    parked = {b: deque() for b in buffers}  # a buffer's messages received after its ack
    stop_sent = False
    final_ckpt = -1
    names = [part_name(p.role, p.site, p.rank) for p in topo.places]

    def save(cid: int, reason: str) -> None:
        """The learner's part of checkpoint ``cid``, then the manifest (last)."""
        meta = {"updates": updates, "weights_version": weights_version, "inserted": inserted,
                "sampled": sampled, "served": {str(b - 1): served[b] for b in buffers},
                "site_steps": {str(b - 1): site_steps[b] for b in buffers},
                "best_eval": best_eval, "last_eval": last_eval, "eval_round": evaluator.round,
                "beta": beta, "wall_s_total": elapsed_before + time.monotonic() - t_start,
                "to_target": to_target}
        arrays = None
        if memory is not None:
            arrays, meta["replay"] = memory_state(memory)
        ckpt.write(cid, meta, arrays, {
            "online": online.state_dict(), "target": target.state_dict(),
            "optimizer": opt.state_dict(), "torch_rng": torch.get_rng_state()})
        ckpt.manifest(cid, names, reason, {"updates": updates, "env_steps": env_steps,
                                           "inserted": inserted, "sampled": sampled,
                                           "best_eval": best_eval})

    if resume is not None:  # continue where the checkpoint left off
        ts, r = resume.torch, resume.meta
        online.load_state_dict(ts["online"])
        target.load_state_dict(ts["target"])
        opt.load_state_dict(ts["optimizer"])
        torch.set_rng_state(ts["torch_rng"])
        updates, weights_version = r["updates"], r["weights_version"]
        inserted, sampled = r["inserted"], r["sampled"]
        best_eval, last_eval = float(r["best_eval"]), float(r["last_eval"])
        evaluator.round = r["eval_round"]
        for b in buffers:
            served[b] = r["served"][str(b - 1)]
            site_steps[b] = r["site_steps"][str(b - 1)]
        elapsed_before, to_target = r["wall_s_total"], r["to_target"]
        if memory is not None:
            restore_memory(memory, resume.arrays, r["replay"])
        beta = beta_now()
    env_steps = sum(site_steps.values())
    prog_steps, prog_updates = env_steps, updates  # rates of the first interval: this launch

    send_weights()
    if at_learner:
        for b in buffers:
            links[b].post(wire.credit(cfg.forward_credits), Tag.CREDIT)

    while len(done) < len(buffers) or any(lk.backlog for lk in links.values()):
        now = time.monotonic()
        fault.check(now)
        did = False
        # [link] everything the buffers sent
        for b, lk in links.items():
            lk.poll(now)
            if b in ckpt_acked:
                continue  # its snapshot is taken: what it sent after waits for ours
            msgs = lk.receive(now)
            if parked[b]:
                msgs = [*parked[b], *msgs]
                parked[b].clear()
            for i, (tag, buf) in enumerate(msgs):
                did = True
                m = wire.unpack(buf, tag, f"buffer {b - 1}")
                if m.kind == Tag.BATCH:
                    max_w[b] = m.b
                    if stop_reason is None:
                        ready[b].append((m, buf.nbytes, now))
                elif m.kind == Tag.FORWARD:
                    frames = m.arrays.get("frames")
                    td = arrival_td(m.arrays["records"], frames)
                    xfer_log.append(buffer=b - 1, update=updates, kind=int(Tag.FORWARD), n=m.count,
                                    nbytes=buf.nbytes, raw_nbytes=m.raw_nbytes or buf.nbytes,
                                    priority_mean=_mean((m.arrays["td_abs"] + cfg.priority_eps) ** cfg.alpha),
                                    arrival_td_mean=_mean(td),
                                    arrival_priority_mean=_mean((td + cfg.priority_eps) ** cfg.alpha),
                                    window=0)
                    if image:
                        memory.add(m.arrays["records"], frames, m.arrays["td_abs"])
                    else:
                        memory.add(m.arrays["records"], m.arrays["td_abs"])
                    inserted += m.count
                    served[b] += m.count
                    owed[b] += 1
                elif m.kind == Tag.STATS:
                    site_steps[b] = int(m.a)
                    recent.extend(m.arrays["returns"].tolist())
                elif m.kind == Tag.DONE:
                    site_steps[b] = int(m.a)
                    done.add(b)
                    lk.post(wire.done(0, 0), Tag.DONE)
                elif m.kind == Tag.CHECKPOINT and m.seq == ckpt_id:
                    ckpt_acked[b] = site_steps[b] = int(m.a)
                    parked[b].extend(msgs[i + 1:])
                    break
                else:
                    raise RuntimeError(f"learner: unexpected {m.kind.name} from buffer {b - 1}")
        env_steps = sum(site_steps.values())
        # [checkpoint] every buffer (and through it every actor) has its part on disk
        if ckpt_id >= 0 and len(ckpt_acked) == len(buffers):
            t_acks = time.monotonic()
            save(ckpt_id, "periodic")
            say(f"mpirl: checkpoint {ckpt_id} written in {time.monotonic() - ckpt_t0:.2f} s "
                f"(every part acknowledged after {t_acks - ckpt_t0:.2f} s; {updates:,} updates, "
                f"{env_steps:,} env steps)")
            ckpt_id, t_ckpt = -1, time.monotonic()
            ckpt_acked.clear()
            did = True
        elif ckpt_id >= 0 and now - ckpt_t0 > ckpt_timeout:
            raise RuntimeError(f"checkpoint {ckpt_id}: no acknowledgement from buffer(s) "
                               f"{sorted(b - 1 for b in set(buffers) - set(ckpt_acked))} after "
                               f"{ckpt_timeout:.0f} s")
        elif (ckpt is not None and cfg.checkpoint_seconds and ckpt_id < 0 and stop_reason is None
              and now - t_ckpt >= cfg.checkpoint_seconds):
            ckpt_id, ckpt_next, ckpt_t0 = ckpt_next, ckpt_next + 1, now
            for lk in links.values():
                lk.post(wire.checkpoint(ckpt_id), Tag.CHECKPOINT, now)
        # [link] tokens for forwarded experiences: the learner-side rate limiter
        if at_learner:
            # the site furthest behind its share gets its tokens first
            for b in sorted(buffers, key=lambda x: served[x] / weight[x]):
                limit_ok = (cfg.replay_ratio == 0 or stop_reason is not None
                            or inserted <= cfg.learning_starts + sampled / cfg.replay_ratio)
                if owed[b] and limit_ok and b not in done:  # after its DONE it has left
                    links[b].post(wire.credit(owed[b]), Tag.CREDIT, now)
                    owed[b] = 0
        # [algorithm] one update
        if change is not None and now - t_start >= change[0]:
            for lk in links.values():
                lk.set_profile(PROFILES[change[1]])
            change = None
        if stop_reason is None:
            beta = beta_now()
            t_step0 = time.monotonic()
            trained = False
            if at_learner and len(memory) >= max(cfg.learning_starts, 1) and (
                    cfg.replay_ratio == 0  # the ratio holds sampling too (credits hold inserts)
                    or sampled <= cfg.replay_ratio * (inserted - cfg.learning_starts)):
                memory.beta = beta
                if image:
                    s, table = memory.sample(cfg.batch_size)
                    td = train(s.records, s.weights, table)
                else:
                    s = memory.sample(cfg.batch_size)
                    td = train(s.records, s.weights)
                memory.update(s.indices, s.generations, td)
                sampled += cfg.batch_size
                did = trained = True
            elif any(ready.values()):
                # the site furthest behind its share goes next (weighted fair queueing)
                b = min((x for x in buffers if ready[x]), key=lambda x: served[x] / weight[x])
                m, nbytes, arrived = ready[b].popleft()
                served[b] += 1
                w = m.arrays["weights"]
                if m.b < max(max_w.values()):  # one scale for every site: the global largest
                    w = w * np.float32(m.b / max(max_w.values()))  # weight is 1 (docs/design.md)
                td = train(m.arrays["records"], w, m.arrays.get("frames"))
                t_done = time.monotonic()
                step_s = t_done - t_step0 if step_s is None else 0.9 * step_s + 0.1 * (t_done - t_step0)
                links[b].post(wire.priorities(m.arrays["indices"], m.arrays["generations"], td,
                                              m.seq, m.a, hold=t_done - arrived, step=step_s,
                                              updates=updates),
                              Tag.PRIORITIES)
                xfer_log.append(buffer=b - 1, update=updates, kind=int(Tag.BATCH), n=m.count,
                                nbytes=nbytes, raw_nbytes=m.raw_nbytes or nbytes,
                                priority_mean=_mean(m.arrays["priorities"]),
                                arrival_td_mean=_mean(td),
                                arrival_priority_mean=_mean((td + cfg.priority_eps) ** cfg.alpha),
                                window=int(m.arrays["window"][0]))
                sampled += m.count
                did = trained = True
            if trained and updates % cfg.weights_every == 0:  # not again on a turn without one
                send_weights()
            # greedy evaluation and the stop decision
            if updates and updates - last_eval >= cfg.eval_every:
                last_eval = updates
                eval_q.load(online.flat_params())
                rets = evaluator.run(eval_q)
                eval_log.append(update=updates, env_steps=env_steps, ret_mean=rets.mean(),
                                ret_std=rets.std(), ret_min=rets.min())
                best_model.offer(log.path.parent, online.state_dict(), rets, best_eval,
                                 update=updates, env_steps=env_steps)
                best_eval = max(best_eval, float(rets.mean()))
                if target_return is not None and rets.mean() >= target_return:
                    stop_reason = "target_return"
                    to_target = {"time_to_target_s": elapsed_before + time.monotonic() - t_start,
                                 "env_steps_to_target": env_steps, "updates_to_target": updates}
            if stop_reason is None and cfg.max_env_steps and env_steps >= cfg.max_env_steps:
                stop_reason = "max_env_steps"
            if stop_reason is None and cfg.max_seconds and now - t_start >= cfg.max_seconds:
                stop_reason = "max_seconds"
            if stop_reason is None and stop_signal is not None and stop_signal.requested:
                stop_reason = stop_signal.requested  # SIGTERM / SIGINT: stop cleanly
        if stop_reason is not None and not stop_sent and ckpt_id < 0:
            # after any checkpoint in progress; every rank writes the final one before DONE
            final_ckpt = ckpt_next if ckpt is not None else -1
            say(f"mpirl: stopping ({stop_reason}) after {now - t_start:.1f} s, "
                f"{env_steps:,} env steps, {updates:,} updates, best eval {best_eval:.1f}")
            for lk in links.values():
                lk.post(wire.stop(final_ckpt), Tag.STOP, now)
            stop_sent = True
        # progress line and link accounting
        if cfg.progress_seconds and now - t_prog >= cfg.progress_seconds:
            dt = now - t_prog
            # from the totals: the /link rows reset the interval counters (take()) every
            # flush_seconds / 2, so those held only the bytes since the last /link row
            link_total = sum(lk.sent.total_bytes + lk.received.total_bytes
                             for lk in links.values())
            link_bytes, prog_link = link_total - prog_link, link_total
            row = dict(env_steps=env_steps, updates=updates,
                       env_steps_per_s=(env_steps - prog_steps) / dt,
                       updates_per_s=(updates - prog_updates) / dt,
                       recent_return=float(np.mean(recent)) if recent else np.nan,
                       loss=loss_sum / loss_n if loss_n else np.nan,
                       busy_fraction=(busy - prog_busy) / dt, link_bytes_per_s=link_bytes / dt,
                       interval_s=dt)
            prog_log.append(**row)
            say(f"[{now - t_start:7.1f}s] env steps {env_steps:>10,} ({row['env_steps_per_s']:,.0f}/s)"
                f" | updates {updates:>8,} ({row['updates_per_s']:,.0f}/s, busy "
                f"{row['busy_fraction']:.0%}) | return {row['recent_return']:7.1f}"
                f" | eval {best_eval:7.1f} | loss {row['loss']:.4f}"
                f" | link {row['link_bytes_per_s'] / 1e6:.2f} MB/s")
            t_prog, prog_steps, prog_updates, prog_busy = now, env_steps, updates, busy
            loss_sum, loss_n = 0.0, 0
        finished = len(done) == len(buffers) and not any(lk.backlog for lk in links.values())
        if now - t_link >= cfg.flush_seconds / 2 or finished:  # and a last row at the end
            for b, lk in links.items():
                b_out, m_out, q_s = lk.sent.take()
                b_in, m_in, _ = lk.received.take()
                link_log.append(buffer=b - 1, bytes_in=b_in, msgs_in=m_in, bytes_out=b_out,
                                msgs_out=m_out, queue_s=q_s, interval_s=now - t_link,
                                utilization=min(1.0, b_out * 8 / lk.profile.rate_bps
                                                / max(now - t_link, 1e-9)))
            t_link = now
        log.maybe_flush(now)
        if did:
            backoff.work()
        else:
            backoff.idle(until=min((d for d in (lk.next_departure() for lk in links.values())
                                    if d is not None), default=None))

    if final_ckpt >= 0:  # every buffer's DONE says its part (and its actors') is on disk
        t0 = time.monotonic()
        save(final_ckpt, stop_reason)
        say(f"mpirl: checkpoint {final_ckpt} written in {time.monotonic() - t0:.2f} s; continue "
            f"with --resume {ckpt.run_dir}")
    wall = time.monotonic() - t_start
    summary = {"stop_reason": stop_reason, "target_return": target_return,
               "updates": updates, "env_steps": env_steps,
               "wall_s": wall, "wall_s_total": elapsed_before + wall,
               "checkpoint": final_ckpt if final_ckpt >= 0 else None,
               "resumed_from": resume.id if resume is not None else None,
               "best_eval": best_eval, "busy_fraction": busy / wall,
               "link_bytes_in": sum(lk.received.total_bytes for lk in links.values()),
               "link_bytes_out": sum(lk.sent.total_bytes for lk in links.values()),
               **to_target}
    log.set_attrs(**summary)
    evaluator.close()
    return summary
