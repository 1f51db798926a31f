"""Learner rank (the cloud): trains the DQN and decides when the run stops.

Per loop turn: [link] take what every buffer sent (batches or forwarded experiences, stats,
done); [algorithm] one update when there is data: double DQN, Huber loss weighted by importance
weights, gradient clipping, target copy every ``target_update`` updates; [link] the batch's
priority update back to its buffer (replay_at=buffer), tokens for more forwarded experiences
(replay_at=learner, paced so the learner samples ``replay_ratio`` transitions per insert),
weights to every buffer every ``weights_every`` updates; greedy evaluation every ``eval_every``
updates; the stop decision (target return, env-step, update or time budget) and a progress line.

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
from mpirl import device as device_mod
from mpirl.checkpoint import memory_state, params_sha256, part_name, restore_memory
from mpirl.evaluation import make_runner
from mpirl.frames import stacks
from mpirl.link import PROFILES, LinkEnd, resolve_profile
from mpirl.logs import Field, RunLog
from mpirl.pacing import TokenBucket
from mpirl.qnet import make_learner_q
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


class Pending:
    """An update launched on the device: ``result()`` waits for it and returns ``(loss, |td|)``.

    On CUDA the loss and |td| come back in one non-blocking copy into pinned memory (one
    device -> host transfer per batch), so the host is free between ``launch`` and ``result``;
    on CPU the update has already run."""

    __slots__ = ("_event", "_out")

    def __init__(self, out, event=None):
        self._out, self._event = out, event

    def result(self) -> tuple[float, np.ndarray]:
        if self._event is not None:
            self._event.synchronize()
        out = self._out.numpy()
        return float(out[0]), out[1:].copy()


class TrainStep:
    """The learner's train step, callable on its own (no MPI, no logging; bench/overheads.py
    and bench/gpu.py time it standalone): the online and target networks on ``device``, Adam,
    and one update on a batch.

    ``step(records, weights, frames)`` is one double-DQN update (Huber loss weighted by the
    importance weights, gradient clipping) and returns ``(loss, |td| per sample)``; it counts
    updates (``updates``; a resumed learner sets it) and copies the online network into the
    target after every ``target_update``-th.  It is
    ``put`` (host arrays -> device tensors: on CUDA through pinned staging buffers with
    non-blocking copies), ``launch`` (queue the update) and ``Pending.result``; the learner
    calls them apart to put the next batch on its way while the current one trains."""

    def __init__(self, cfg, spec, device="cpu", amp: str = "off"):
        import torch

        from mpirl.dqn import Adam, dqn_loss

        self.torch, self.loss_fn = torch, dqn_loss
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.amp = amp == "bf16" and self.cuda
        self.spec, self.huber_delta, self.grad_clip = spec, cfg.huber_delta, cfg.grad_clip
        self.online = make_learner_q(spec, cfg.hidden, cfg.dueling).to(self.device)
        self.target = copy.deepcopy(self.online)
        self.params = list(self.online.parameters())
        self.opt = Adam(self.params, lr=cfg.lr)  # torch's kernel, no dynamo import
        self.target_update, self.updates = cfg.target_update, 0
        # CUDA: two sets of pinned host buffers, used in turn, each with the event of its last
        # host -> device copy (a set is rewritten only once that copy is done)
        self._staging = [({}, None), ({}, None)]
        self._turn = 0
        self._out = None  # pinned buffer for loss + |td| coming back

    def state_dict_of(self, flat: np.ndarray) -> dict:
        """The online network's state_dict (on the host) with ``flat`` (``flat_params`` order)
        as its parameters: the weights an evaluation played, taken some updates ago."""
        import torch

        out = {k: v.detach().cpu().clone() for k, v in self.online.state_dict().items()}
        off = 0
        for name, p in self.online.named_parameters():
            n = p.numel()
            out[name] = torch.from_numpy(np.array(flat[off: off + n], np.float32)).view(p.shape)
            off += n
        if off != len(flat):
            raise ValueError(f"{len(flat)} weights for a network of {off} parameters")
        return out

    def put(self, records, weights, frames=None) -> tuple:
        """A batch on the device: (obs, action, reward, next_obs, discount, weights)."""
        torch = self.torch
        if not self.cuda:
            return (*_batch_tensors(torch, records, frames, self.spec.stack),
                    torch.from_numpy(np.ascontiguousarray(weights, np.float32)))
        if frames is not None:
            obs, nxt = stacks(records, frames, self.spec.stack)
        else:
            obs, nxt = records["obs"], records["next_obs"]
        host = ((obs, np.uint8 if frames is not None else np.float32),
                (records["action"], np.int64), (records["reward"], np.float32),
                (nxt, np.uint8 if frames is not None else np.float32),
                (records["discount"], np.float32), (weights, np.float32))
        bufs, event = self._staging[self._turn]
        if event is not None:
            event.synchronize()
        out = []
        for i, (x, dt) in enumerate(host):
            b = bufs.get(i)
            if b is None or tuple(b.shape) != tuple(np.shape(x)):
                b = bufs[i] = torch.empty(np.shape(x), dtype=_TORCH_DTYPES[dt](torch),
                                          pin_memory=True)
            b.numpy()[...] = x  # gathers the field out of the records and casts, in one pass
            out.append(b.to(self.device, non_blocking=True))
        event = torch.cuda.Event()
        event.record()
        self._staging[self._turn] = (bufs, event)
        self._turn ^= 1
        return tuple(out)

    def _loss(self, batch):
        obs, act, rew, nxt, disc, w = batch
        if not self.amp:  # (constructing an autocast context costs microseconds per update)
            return self.loss_fn(self.online, self.target, obs, act, rew, nxt, disc, w,
                                self.huber_delta)
        with self.torch.autocast("cuda", dtype=self.torch.bfloat16):
            return self.loss_fn(self.online, self.target, obs, act, rew, nxt, disc, w,
                                self.huber_delta)

    def launch(self, batch) -> Pending:
        """Queue one update on ``batch`` (from ``put``); on CPU it runs now.  One update in
        flight at a time: take its ``result()`` before the next ``launch``."""
        loss, td = self._loss(batch)
        self.opt.zero_grad()
        loss.backward()
        if self.grad_clip > 0:
            self._clip()
        self.opt.step()
        self.updates += 1
        if self.updates % self.target_update == 0:
            self.sync_target()
        return self._back(loss.detach(), td)

    def _clip(self) -> None:
        """torch.nn.utils.clip_grad_norm_'s foreach path without its wrappers (with them it was
        0.58 of a 2.95 ms CPU update in the learner's profile, now 0.15): scale every gradient
        by min(1, clip / (total norm + 1e-6))."""
        torch = self.torch
        grads = [p.grad for p in self.params if p.grad is not None]
        total = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))
        torch._foreach_mul_(grads, torch.clamp(self.grad_clip / (total + 1e-6), max=1.0))

    def _back(self, loss, td) -> Pending:
        torch = self.torch
        if not self.cuda:
            return Pending(torch.cat([loss.view(1), td]))
        both = torch.cat([loss.float().view(1), td.float()])
        if self._out is None or self._out.numel() != both.numel():
            self._out = torch.empty(both.numel(), dtype=torch.float32, pin_memory=True)
        self._out.copy_(both, non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        return Pending(self._out, event)

    def step(self, records, weights, frames=None) -> tuple[float, np.ndarray]:
        return self.launch(self.put(records, weights, frames)).result()

    def td(self, records, frames=None) -> np.ndarray:
        """|td| of transitions under the current networks, no update (arrival priorities)."""
        torch = self.torch
        batch = self.put(records, np.ones(len(records), np.float32), frames)
        with torch.no_grad():
            _, td = self._loss(batch)
        return td.float().cpu().numpy()

    def sync_target(self) -> None:
        self.target.load_state_dict(self.online.state_dict())


_TORCH_DTYPES = {np.float32: lambda t: t.float32, np.int64: lambda t: t.int64,
                 np.uint8: lambda t: t.uint8}


def _mean(x: np.ndarray) -> float:
    """Mean of a small array for a log row: np.mean's dispatch costs ~4x the sum of 64 values,
    and the learner logs four means per update (docs/benchmarks.md, "Component overheads")."""
    return float(np.add.reduce(x, axis=None)) / x.size if x.size else float("nan")


def _spread(p: np.ndarray) -> dict:
    """Median and p90 of one message's priorities (/transfers), as np.percentile's default
    (linear) method gives them, from one sort: ~1 us for a batch of 64 where np.percentile
    costs ~30 us, once per update in the proposed placement."""
    if not p.size:
        return {"priority_median": np.nan, "priority_p90": np.nan}
    s = np.sort(p, axis=None)
    out = []
    for q in (0.5, 0.9):
        h = (s.size - 1) * q
        lo = int(h)
        hi = min(lo + 1, s.size - 1)
        out.append(float(s[lo]) + (h - lo) * (float(s[hi]) - float(s[lo])))
    return {"priority_median": out[0], "priority_p90": out[1]}


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
        resume=None, refset: tuple[str, str] | None = None) -> dict:
    import torch

    torch.set_num_threads(cfg.torch_threads)
    seed = seeds.learner(cfg.seed, topo.link.Get_size() - 1)
    torch.manual_seed(seed["torch"])
    profile = resolve_profile(cfg)
    buffers = list(range(1, topo.link.Get_size()))  # link ranks of the buffers
    links = {b: LinkEnd(topo.link, b, profile, seed=seed["link"][b - 1]) for b in buffers}
    dev = device_mod.resolve(cfg.device, torch)
    dev_info = device_mod.describe(dev, torch)
    log.set_attrs(**dev_info)
    say(device_mod.banner(dev_info, cfg.amp))
    trainer = TrainStep(cfg, spec, dev, cfg.amp)
    online, target, opt = trainer.online, trainer.target, trainer.opt
    at_learner = cfg.replay_at == "learner"
    memory = make_replay(cfg, spec, wire.record, seed=seed["replay"]) if at_learner else None
    image = spec.image
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
        Field("priority_median", "f4", "", "median of those priorities (all n)"),
        Field("priority_p90", "f4", "", "90th percentile of those priorities (all n; numpy's "
              "linear interpolation)"),
        Field("arrival_td_mean", "f4", "", "mean |td| under the learner's network on arrival, "
              "over a random subsample of min(n, --arrival-sample) of them (NaN with 0)"),
        Field("arrival_priority_mean", "f4", "", "mean (|td|+eps)^alpha of the same subsample"),
        Field("arrival_n", "i4", "transitions", "size of that subsample"),
        Field("window", "i4", "batches", "the sending buffer's in-flight window when it sent "
              "the batch (replay_at=buffer; 0 for forwarded experiences)"),
    ], doc="every message of experiences that crossed the link toward the learner")
    eval_log = log.stream("evals", [
        Field("update", "i8", "", "learner updates so far"),
        Field("env_steps", "i8", "steps", "env steps of all actors so far"),
        Field("ret_mean", "f8", "reward", "greedy evaluation mean return"),
        Field("ret_std", "f8", "reward", "std of the evaluation returns"),
        Field("ret_min", "f8", "reward", "worst evaluation return"),
        Field("eval_s", "f8", "s", "wall time the evaluation ran (in the --evaluator runner)"),
        Field("lag_updates", "i8", "", "updates trained between taking the weights (update) "
              "and handling the result (t)"),
        Field("reference_loss", "f8", "", "unweighted Huber TD loss of the evaluated weights "
              "(their own target) on the --reference-set (NaN without one)"),
        Field("reference_td_abs_mean", "f8", "", "mean |td| on the --reference-set"),
    ], doc="greedy evaluations (eval_episodes episodes each), one row per finished evaluation")
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
        Field("rho", "f8", "", "samples per produced transition over the interval: updates x "
              "batch_size / env steps (what --learner-updates-per-s and --actor-steps-per-s "
              "set; NaN when no env steps were reported)"),
        Field("delivered_fraction", "f8", "", "replay_at=learner: transitions inserted into "
              "the learner's memory / env steps produced, over the interval (< 1: the link or "
              "--forward-overflow drop-oldest lost some; NaN for replay_at=buffer)"),
        Field("capped_s", "f8", "s", "time a batch was ready but --learner-updates-per-s held "
              "the update back, over the interval (the cap, not the data, set the pace)"),
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

    def next_batch():
        """The next batch, picked and put on its way to the device: (source, device batch),
        or None.  Source: the sample (replay_at=learner) or (site, BATCH message, bytes,
        arrival time)."""
        nonlocal sampled, busy
        if at_learner:
            if len(memory) < max(cfg.learning_starts, 1):
                return None
            if cfg.replay_ratio and sampled > cfg.replay_ratio * (inserted - cfg.learning_starts):
                return None  # the ratio holds sampling too (credits hold inserts)
            memory.beta = beta
            s, table = memory.sample(cfg.batch_size) if image else (
                memory.sample(cfg.batch_size), None)
            sampled += cfg.batch_size
            src, records, weights, frames = s, s.records, s.weights, table
        elif any(ready.values()):
            # the site furthest behind its share goes next (weighted fair queueing)
            b = min((x for x in buffers if ready[x]), key=lambda x: served[x] / weight[x])
            src = (b, *ready[b].popleft())
            served[b] += 1
            m = src[1]
            records, weights, frames = m.arrays["records"], m.arrays["weights"], m.arrays.get(
                "frames")
            if m.b < max(max_w.values()):  # one scale for every site: the global largest
                weights = weights * np.float32(m.b / max(max_w.values()))  # is 1 (design.md)
        else:
            return None
        t0 = time.monotonic()
        batch = trainer.put(records, weights, frames)
        busy += time.monotonic() - t0
        return src, batch

    def train(batch) -> tuple[np.ndarray, float]:
        """One DQN update on ``batch``; while it runs (on CUDA) the next batch is put on its
        way (prefetch).  Returns |td| per sample (the new priorities' raw material) and the
        seconds the learner spent on it."""
        nonlocal updates, busy, loss_sum, loss_n, staged
        t0 = time.monotonic()
        pending = trainer.launch(batch)  # copies the target on its cadence
        t1 = time.monotonic()
        staged = next_batch()
        t2 = time.monotonic()
        lv, td_np = pending.result()
        updates = trainer.updates
        t3 = time.monotonic()
        upd_log.append(update=updates, loss=lv, td_abs_mean=_mean(td_np), beta=beta)
        loss_sum += lv
        loss_n += 1
        spent = (t1 - t0) + (t3 - t2)
        busy += spent
        return td_np, spent

    arrival_rng = np.random.default_rng(seed["replay"] + 1)

    def arrival_pick(n: int) -> np.ndarray | None:
        """Which of a message's n transitions enter the arrival |td| statistic: a uniform random
        subsample of min(n, --arrival-sample), in both placements (None: --arrival-sample 0)."""
        k = min(n, cfg.arrival_sample)
        if k == 0:
            return None
        return np.arange(n) if k == n else np.sort(arrival_rng.choice(n, k, replace=False))

    def arrival_stats(td: np.ndarray | None) -> dict:
        if td is None:
            return {"arrival_td_mean": np.nan, "arrival_priority_mean": np.nan, "arrival_n": 0}
        return {"arrival_td_mean": _mean(td),
                "arrival_priority_mean": _mean((td + cfg.priority_eps) ** cfg.alpha),
                "arrival_n": td.size}

    def arrival_td(records, frames=None) -> np.ndarray | None:
        """|td| of a forwarded message's subsample under the current networks: one forward pass
        over at most --arrival-sample transitions, whatever the chunk size."""
        pick = arrival_pick(len(records))
        return None if pick is None else trainer.td(records[pick], frames)

    def send_weights() -> None:
        nonlocal weights_version, flat
        weights_version += 1
        flat = (updates, online.flat_params())  # off the device once per broadcast
        buf = wire.weights(flat[1], weights_version, updates)
        for b in buffers:
            links[b].post(buf, Tag.WEIGHTS)

    def evaluated(res) -> None:
        """A finished greedy evaluation (``res``: mpirl.evaluation.EvalResult, whose ``params``
        are the weights evaluated): its row, the best so far, the stop decision."""
        nonlocal best_eval, stop_reason, to_target
        rets = res.returns
        eval_log.append(update=res.update, env_steps=res.env_steps, ret_mean=rets.mean(),
                        ret_std=rets.std(), ret_min=rets.min(), eval_s=res.eval_s,
                        lag_updates=updates - res.update, reference_loss=res.reference_loss,
                        reference_td_abs_mean=res.reference_td)
        if float(rets.mean()) > best_eval:  # the weights evaluated, not today's online net
            best_model.offer(log.path.parent, trainer.state_dict_of(res.params), rets, best_eval,
                             update=res.update, env_steps=res.env_steps)
        best_eval = max(best_eval, float(rets.mean()))
        if target_return is not None and rets.mean() >= target_return and stop_reason is None:
            stop_reason = "target_return"
            to_target = {"time_to_target_s": elapsed_before + time.monotonic() - t_start,
                         "env_steps_to_target": res.env_steps, "updates_to_target": res.update}

    def beta_now() -> float:
        return beta_at(cfg, updates)

    backoff = Backoff()
    updates = weights_version = -1
    updates = 0
    flat = (-1, None)  # (updates, flat weights) of the last broadcast
    staged = None  # the next batch, already on its way to the device
    eval_round = 0
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
    prog_steps = prog_updates = prog_inserted = 0
    prog_capped = 0.0
    # --learner-updates-per-s: a token per update (started with the loop, after start-up)
    cap = TokenBucket(cfg.learner_updates_per_s) if cfg.learner_updates_per_s else None
    capped_s = 0.0  # time a batch was staged but the cap held it (summed per loop turn)
    t_turn = None  # start of the last turn the cap held an update, for capped_s
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
                "best_eval": best_eval, "last_eval": last_eval, "eval_round": eval_round,
                "beta": beta, "wall_s_total": elapsed_before + time.monotonic() - t_start,
                "to_target": to_target, "online_sha256": params_sha256(online.state_dict()),
                "target_sha256": params_sha256(target.state_dict())}
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
        log.set_attrs(resumed_online_sha256=params_sha256(online.state_dict()),
                      resumed_target_sha256=params_sha256(target.state_dict()))
        updates, weights_version = r["updates"], r["weights_version"]
        trainer.updates = updates  # the target copy cadence continues
        inserted, sampled = r["inserted"], r["sampled"]
        best_eval, last_eval = float(r["best_eval"]), float(r["last_eval"])
        eval_round = r["eval_round"]
        for b in buffers:
            served[b] = r["served"][str(b - 1)]
            site_steps[b] = r["site_steps"][str(b - 1)]
        elapsed_before, to_target = r["wall_s_total"], r["to_target"]
        if memory is not None:
            restore_memory(memory, resume.arrays, r["replay"])
        beta = beta_now()
    env_steps = sum(site_steps.values())
    prog_steps, prog_updates = env_steps, updates  # rates of the first interval: this launch
    prog_inserted = inserted

    send_weights()
    if at_learner:
        for b in buffers:
            links[b].post(wire.credit(cfg.forward_credits), Tag.CREDIT)
    # after the first weights: off start-up
    eval_runner = make_runner(cfg.evaluator, cfg, spec, refset)

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
                    pr = (m.arrays["td_abs"] + cfg.priority_eps) ** cfg.alpha
                    xfer_log.append(buffer=b - 1, update=updates, kind=int(Tag.FORWARD), n=m.count,
                                    nbytes=buf.nbytes, raw_nbytes=m.raw_nbytes or buf.nbytes,
                                    priority_mean=_mean(pr), **_spread(pr), **arrival_stats(td),
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
            trained = False
            if staged is None:
                staged = next_batch()
            # the budget and the cap (a token per update) may hold a batch that is ready
            go = staged is not None and not (cfg.max_updates and updates >= cfg.max_updates)
            held = go and cap is not None and not cap.try_take(now)
            if t_turn is not None:  # the cap held the batch from the last turn until now
                capped_s += now - t_turn
            t_turn, go = (now, False) if held else (None, go)
            if go and at_learner:
                s = staged[0]
                td, _ = train(staged[1])
                memory.update(s.indices, s.generations, td)
                did = trained = True
            elif go:
                (b, m, nbytes, arrived), batch = staged
                td, spent = train(batch)
                t_done = time.monotonic()
                step_s = spent if step_s is None else 0.9 * step_s + 0.1 * spent
                links[b].post(wire.priorities(m.arrays["indices"], m.arrays["generations"], td,
                                              m.seq, m.a, hold=t_done - arrived, step=step_s,
                                              updates=updates),
                              Tag.PRIORITIES)
                pick = arrival_pick(len(td))  # the batch's own |td|: no extra forward pass
                pr = m.arrays["priorities"]
                xfer_log.append(buffer=b - 1, update=updates, kind=int(Tag.BATCH), n=m.count,
                                nbytes=nbytes, raw_nbytes=m.raw_nbytes or nbytes,
                                priority_mean=_mean(pr), **_spread(pr),
                                **arrival_stats(None if pick is None else td[pick]),
                                window=int(m.arrays["window"][0]))
                sampled += m.count
                did = trained = True
            if trained and updates % cfg.weights_every == 0:  # not again on a turn without one
                send_weights()
            # greedy evaluation (off the update loop: --evaluator) and the stop decision
            if updates and updates - last_eval >= cfg.eval_every and not eval_runner.busy:
                last_eval = updates
                eval_runner.request(flat[1] if flat[0] == updates else online.flat_params(),
                                    eval_round, updates, env_steps)
                eval_round += 1
            res = eval_runner.poll()
            if res is not None:
                evaluated(res)
            if stop_reason is None and cfg.max_env_steps and env_steps >= cfg.max_env_steps:
                stop_reason = "max_env_steps"
            if stop_reason is None and cfg.max_updates and updates >= cfg.max_updates:
                stop_reason = "max_updates"
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
            d_steps = env_steps - prog_steps
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
                       interval_s=dt,
                       rho=((updates - prog_updates) * cfg.batch_size / d_steps if d_steps > 0
                            else np.nan),
                       delivered_fraction=((inserted - prog_inserted) / d_steps
                                           if at_learner and d_steps > 0 else np.nan),
                       capped_s=capped_s - prog_capped)
            prog_log.append(**row)
            say(f"[{now - t_start:7.1f}s] env steps {env_steps:>10,} ({row['env_steps_per_s']:,.0f}/s)"
                f" | updates {updates:>8,} ({row['updates_per_s']:,.0f}/s, busy "
                f"{row['busy_fraction']:.0%}) | return {row['recent_return']:7.1f}"
                f" | eval {best_eval:7.1f} | loss {row['loss']:.4f}"
                f" | link {row['link_bytes_per_s'] / 1e6:.2f} MB/s")
            t_prog, prog_steps, prog_updates, prog_busy = now, env_steps, updates, busy
            prog_inserted, prog_capped = inserted, capped_s
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
            wake = [d for d in (lk.next_departure() for lk in links.values()) if d is not None]
            if t_turn is not None:  # the cap holds a ready batch: wake when its token is there
                wake.append(cap.ready_at())
            backoff.idle(until=min(wake, default=None))

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
               "delivered_fraction": (inserted / env_steps if at_learner and env_steps
                                      else None),
               "link_bytes_in": sum(lk.received.total_bytes for lk in links.values()),
               "link_bytes_out": sum(lk.sent.total_bytes for lk in links.values()),
               **to_target}
    log.set_attrs(**summary)
    eval_runner.close()
    return summary
