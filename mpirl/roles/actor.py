"""Actor rank: steps gymnasium environments and sends n-step experiences to its site's buffer.

`Actor.run` is the loop; each turn is a list of named steps, each a method:

    receive      weights, tokens, checkpoint, stop from the buffer, without blocking (at most
                 every POLL_S while tokens last): one handler per kind (``on_<kind>``)
    held_back    no token and too much waiting (backpressure), or --actor-steps-per-s: wait
    act          one batched greedy forward over this actor's envs, Ape-X epsilon per env
    step_envs    one env step each, n-step accumulation, finished episodes
    ship         when a chunk is full and a token is free: initial priorities with this
                 actor's network copy, ``Isend`` to the buffer (`send_chunk`)
    report       an /actor row per flush interval
and after the loop ``hand_over``: the rest, the final checkpoint part, DONE, drain.

Flow control (token control): an actor may have ``actor_credits`` experience messages that the
buffer has not yet granted back.  Without a token it keeps stepping until ``4 * actor_chunk``
transitions are waiting, then waits for a token (backpressure; the wait is counted as throttled
time and the CPU goes to other ranks).

Checkpoints (`mpirl.transport.cut`): on CHECKPOINT the actor writes its part (counters, epsilons,
RNG state and the transitions it has not sent yet) and acknowledges; on STOP with a checkpoint id it
writes its final part before DONE.  Resumed, it continues those counters with fresh episodes (env
states are not saved: the episodes in progress and their incomplete n-step windows are dropped).

Image observations (see mpirl.agent.frames): every frame gets an id in this actor's ``FrameLog``;
the n-step accumulator and the outgoing lists hold stacks of ids, and a message carries each frame
it refers to once.  Rewards of image envs are clipped to [-1, 1] before the n-step sum (the
episode returns logged stay unclipped); with ``--episodic-life`` a lost life ends the n-step
return (discount 0) while the game goes on.  Image runs act with the torch CNN (imported here
only then); vector runs keep NumpyQ and never import torch.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from mpirl import seeds
from mpirl.agent import envs as envs_mod
from mpirl.agent.frames import FrameLog, stacks
from mpirl.agent.nstep import DISCOUNT, NStep
from mpirl.agent.qnet import make_q
from mpirl.logs import schema
from mpirl.logs.runlog import RunLog
from mpirl.run import failure
from mpirl.run.checkpoint import restore_rng, rng_meta
from mpirl.transport.pacing import TokenBucket
from mpirl.transport.waiting import Backoff
from mpirl.transport.wire import Checkpoint, Credit, Message, Stop, Tag, Weights, Wire

if TYPE_CHECKING:
    from mpirl.agent.envs import EnvSpec
    from mpirl.run.checkpoint import Checkpointer, Part
    from mpirl.run.config import Config
    from mpirl.transport.inbox import SitePort
    from mpirl.transport.topology import Topology

BUFFER = 0  # the site's buffer is site rank 0

POLL_S = 0.0005  # seconds between MPI polls of an actor that holds tokens


def epsilon(i: int, n: int, base: float, alpha: float) -> float:
    """Ape-X per-env exploration: eps_i = base^(1 + alpha * i / (n - 1))."""
    return base ** (1 + alpha * i / (n - 1)) if n > 1 else base


class Outgoing:
    """Transitions made, not yet sent: one tuple per transition, ``(obs, act, ret, next, disc,
    qsa, max_q_next)``, one list append per transition (the cheapest per env step).
    ``max_q_next`` is a one-element list for max_a Q(s', a): filled by the next acting forward of
    its env (s' is the observation acted on next), so an image run does not run the CNN twice
    over every state; those still NaN at send time (s' ended the episode, or the chunk leaves
    before the next forward) are computed then."""

    NAMES = ("obs", "act", "ret", "next", "disc", "qsa")

    def __init__(self) -> None:
        self.rows: list[tuple] = []

    def __len__(self) -> int:
        return len(self.rows)

    def columns(self, k: int | None = None) -> tuple[list, ...]:
        """The first ``k`` transitions (all: None) as seven lists: NAMES, then max_q_next."""
        rows = self.rows if k is None else self.rows[:k]
        return tuple(map(list, zip(*rows, strict=True))) if rows else tuple([] for _ in range(7))

    def extend(self, *columns: list) -> None:
        self.rows.extend(zip(*columns, strict=True))

    def drop(self, k: int) -> None:
        del self.rows[:k]


class Actor:
    """One actor rank's envs, network copy, counters and loop."""

    def __init__(
        self,
        cfg: Config,
        topo: Topology,
        spec: EnvSpec,
        wire: Wire,
        log: RunLog,
        site: SitePort,
        ckpt: Checkpointer | None = None,
        resume: Part | None = None,
    ) -> None:
        """``site``: this actor's end of the site network (`mpirl.wiring.connect`)."""
        self.cfg, self.spec, self.wire, self.log, self.ckpt = cfg, spec, wire, log, ckpt
        self.site, self.me = site, topo.place
        n_envs = self.n_envs = cfg.envs_per_actor
        # a resumed run starts fresh episodes, seeded apart from those of earlier launches
        self.seed = seeds.actor(
            cfg.seed,
            self.me.rank,
            self.me.index,
            topo.n_actors,
            n_envs,
            None if resume is None else resume.id,
        )
        self.rng = np.random.default_rng(self.seed["exploration"])
        self.envs = [
            envs_mod.make(cfg.env, seed=s, kwargs=cfg.env_kwargs, wrappers=cfg.wrapper_specs())
            for s in self.seed["envs"]
        ]
        n_total = topo.n_actors * n_envs
        self.eps = np.array(
            [
                epsilon(self.me.index * n_envs + j, n_total, cfg.eps_base, cfg.eps_alpha)
                for j in range(n_envs)
            ]
        )
        self.eps_list = self.eps.tolist()  # act() compares Python floats
        self.nsteps = [NStep(cfg.n_step, cfg.gamma) for _ in range(n_envs)]
        self.q = make_q(spec, cfg.hidden, cfg.dueling)
        # what env.step gets for action index i: the action space's own integer type, as its
        # sample() returns; gymnasium's Discrete.contains (CartPole asserts it every step) takes
        # 2.1 us for a Python int and 1.6 us for one of these (of a CartPole actor's ~15 us step)
        space_dtype = self.envs[0].action_space.dtype
        assert space_dtype is not None  # a Discrete space has one
        dtype = space_dtype.type
        self.env_action = [dtype(i) for i in range(spec.n_actions)]
        self.flog = (
            FrameLog(spec.stack, cast("tuple[int, ...]", spec.frame_shape)) if spec.image else None
        )
        self.ids: list = [None] * n_envs  # image runs: the current stack of frame ids per env
        self.lives = np.zeros(n_envs, np.int64)
        self.episodic_life = cfg.episodic_life and spec.family == "atari"
        self.logs = schema.open_streams(log, "actor")
        log.set_attrs(epsilons=self.eps)
        self.handlers: dict[Tag, Callable[[Any], None]] = {
            Tag.WEIGHTS: self.on_weights,
            Tag.CREDIT: self.on_credit,
            Tag.STOP: self.on_stop,
            Tag.CHECKPOINT: self.on_checkpoint,
        }
        self.reuse: dict[int, np.ndarray] = {
            Tag.WEIGHTS: np.empty(wire_nbytes_weights(wire), np.uint8)
        }
        self.tokens = cfg.actor_credits
        self.backoff = Backoff()
        self.fault = failure.FAULT
        self.weights_version = -1
        self.weights_updates = 0
        self.stop = False
        self.final_ckpt = -1
        # counters (checkpointed)
        self.env_steps = self.steps_reported = self.seq = self.msgs = self.nbytes = 0
        self.throttled = 0.0
        self.paced_before = 0.0  # pacing sleep of earlier launches (resumed runs)
        self.done_episodes = 0
        self.pace: TokenBucket | None = (
            None  # --actor-steps-per-s: a token per env step, from the first weights
        )
        self.out = Outgoing()
        self.waiting: list[list] = [
            [] for _ in range(n_envs)
        ]  # per env: max_q_next its next forward fills
        self.returns_to_send: list[float] = []
        self.t_polled = 0.0
        self.next_row = 0.0
        if resume is not None:
            self.restore(resume)

    # ---- the loop -----------------------------------------------------------------------------
    def run(self) -> None:
        self.wait_for_weights()
        self.start_episodes()
        while not self.stop:
            self.fault.check()
            now = time.monotonic()
            self.receive(now)
            if self.held_back(now):
                continue
            self.backoff.work()
            actions, q_sa = self.act()
            self.step_envs(actions, q_sa)
            self.ship()
            self.report()
        self.hand_over()

    def wait_for_weights(self) -> None:
        """No env step is taken with an untrained zero network."""
        while self.weights_version < 0 and not self.stop:
            self.receive(time.monotonic(), force=True)
            self.backoff.idle()

    def start_episodes(self) -> None:
        if self.cfg.actor_steps_per_s:  # P = actors x this, whatever the placement
            self.pace = TokenBucket(self.cfg.actor_steps_per_s, take=self.n_envs)
        first = [e.reset(seed=s) for s, e in zip(self.seed["envs"], self.envs, strict=True)]
        self.obs = np.stack([o for o, _ in first])
        for j, (o, info) in enumerate(first):
            self.lives[j] = info.get("lives", 0)
            if self.flog is not None:
                self.ids[j] = self.flog.reset(o)
        self.ep_ret = [0.0] * self.n_envs  # Python numbers: numpy scalar arithmetic costs more
        self.ep_len = [0] * self.n_envs
        self.first_step = True
        self.next_row = time.monotonic() + self.cfg.flush_seconds
        self.t_polled = 0.0  # poll at once

    # ---- receive: one handler per message kind ------------------------------------------------
    def receive(self, now: float, force: bool = False) -> None:
        """What the buffer sent, never blocking; while tokens last at most every POLL_S (an
        Improbe per 4-env turn was ~5% of the actor's time).  Then the sends that completed."""
        if force or self.tokens <= 0 or now - self.t_polled >= POLL_S:
            self.t_polled = now
            self.site.inbox.serve(self.handlers, source=BUFFER, reuse=self.reuse, now=now)
        self.site.poll()

    def on_weights(self, m: Weights) -> None:
        self.q.load(m.params)
        self.weights_version = m.version
        self.weights_updates = m.updates

    def on_credit(self, m: Credit) -> None:
        self.tokens += m.tokens

    def on_stop(self, m: Stop) -> None:
        self.stop = True
        self.final_ckpt = m.checkpoint

    def on_checkpoint(self, m: Checkpoint) -> None:
        """Snapshot between two steps, then acknowledge (`mpirl.transport.cut`)."""
        self.save(m.id)
        self.send_to_buffer(self.wire.checkpoint(m.id, self.env_steps))

    def send_to_buffer(self, buf: np.ndarray) -> None:
        """Nonblocking, kept until it completes (`mpirl.transport.inbox.SitePort`)."""
        self.site.post(buf, BUFFER)

    # ---- wait when held back ------------------------------------------------------------------
    def held_back(self, now: float) -> bool:
        """Backpressure (too much waiting and no token: wait for the buffer, counted as
        throttled) or pacing (one token per env step of this turn; without them sleep at most
        the back-off ceiling, so stop and weights are still served).  True: skip this turn."""
        if len(self.out.rows) >= 4 * self.cfg.actor_chunk and self.tokens <= 0:
            t0 = time.monotonic()
            self.backoff.idle()
            self.throttled += time.monotonic() - t0
            return True
        if self.pace is not None and not self.pace.try_take(now):
            self.pace.wait(self.backoff.ceiling)
            return True
        return False

    # ---- act and step -------------------------------------------------------------------------
    def act(self) -> tuple[list, list]:
        """One batched forward, epsilon-greedy per env; fills the max_q_next waiting for this
        forward's max_a Q.  Returns (actions, Q(s, a)) as Python lists.

        Per turn one draw of 2n uniforms (n envs): env j explores when ``u[j] < eps[j]`` and
        then takes action ``floor(u[n + j] * n_actions)``; ``Generator.integers`` for the random
        actions cost 6.5 us a call here, 9x a uniform draw.  The Q-values come to Python once
        (``tolist``) and max / argmax are taken there (``list.index`` of the max is numpy's
        argmax, the first maximum): for a few envs cheaper than numpy's per-call dispatch."""
        n, n_actions, eps = self.n_envs, self.spec.n_actions, self.eps_list
        rows = self.q(self.obs).tolist()
        u = self.rng.random(2 * n).tolist()
        actions, q_sa = [], []
        for j, row in enumerate(rows):
            best = max(row)
            waiting = self.waiting[j]
            if waiting:
                for max_q_next in waiting:
                    max_q_next[0] = best
                waiting.clear()
            a = min(int(u[n + j] * n_actions), n_actions - 1) if u[j] < eps[j] else row.index(best)
            actions.append(a)
            q_sa.append(row[a])
        return actions, q_sa

    def step_envs(self, actions: list, q_sa: list) -> None:
        """One step of every env: n-step transitions into the outgoing rows, finished
        episodes logged and reset."""
        flog, obs, ids = self.flog, self.obs, self.ids
        ep_ret, ep_len, lives = self.ep_ret, self.ep_len, self.lives
        nsteps, waiting = self.nsteps, self.waiting
        clip, episodic_life = self.spec.clip_rewards, self.episodic_life
        add, nan, env_action, disc = self.out.rows.append, np.nan, self.env_action, DISCOUNT
        for j, env in enumerate(self.envs):
            a = actions[j]
            nxt, r, term, trunc, info = env.step(env_action[a])
            ep_ret[j] += float(r)  # float64 sums whatever the env's reward type
            ep_len[j] += 1
            if clip:
                r = float(np.clip(float(r), -1.0, 1.0))
            life_lost = False
            if episodic_life:
                life_lost = 0 < info.get("lives", 0) < lives[j]
                lives[j] = info.get("lives", 0)
            if flog is not None:
                here = ids[j]
                there = ids[j] = flog.step(here, nxt)
            else:
                here, there = obs[j].copy(), nxt
            ended = term or trunc
            for t in nsteps[j].push(here, a, r, there, term or life_lost, trunc, q_sa[j]):
                if t[disc] == 0.0:
                    max_q_next = [0.0]
                else:
                    max_q_next = [nan]
                    if not ended:
                        waiting[j].append(max_q_next)  # s' = nxt, acted on at the next forward
                add(t + (max_q_next,))
            if ended:
                self.end_episode(j)
                nxt, info = env.reset()
                lives[j] = info.get("lives", 0)
                if flog is not None:
                    ids[j] = flog.reset(nxt)
            obs[j] = nxt
        self.env_steps += len(actions)
        if self.first_step:  # where start-up ends, on the wall clock (bench/overheads.py reads it)
            self.log.set_attrs(first_step_unix=time.time())
            self.first_step = False

    def end_episode(self, j: int) -> None:
        self.logs["episodes"].append(
            env=j, ret=self.ep_ret[j], length=self.ep_len[j], epsilon=self.eps[j]
        )
        self.returns_to_send.append(self.ep_ret[j])
        self.done_episodes += 1
        self.ep_ret[j], self.ep_len[j] = 0.0, 0

    # ---- ship ---------------------------------------------------------------------------------
    def ship(self) -> None:
        """Full chunks while tokens last."""
        while len(self.out.rows) >= self.cfg.actor_chunk and self.tokens > 0:
            self.send_chunk()

    def send_chunk(self, final: bool = False) -> None:
        """Pack up to actor_chunk transitions with initial priorities; Isend to the buffer."""
        spec, flog, out = self.spec, self.flog, self.out
        k = len(out) if final else self.cfg.actor_chunk
        if k == 0 and not self.returns_to_send and self.env_steps == self.steps_reported:
            return
        o_obs, o_act, o_ret, o_next, o_disc, o_qsa, o_max_q_next = out.columns(k)
        rec = np.empty(k, self.wire.record)
        rec["action"] = o_act
        rec["reward"] = o_ret
        rec["discount"] = o_disc
        table = None
        if flog is not None:  # image run: each frame once, records index the table
            rec["frames"], table = flog.pack(o_obs, o_next)
            next_obs = stacks(rec, table, spec.stack)[1]
        elif k:  # a final message may carry only returns and step counts
            rec["obs"] = o_obs
            rec["next_obs"] = o_next
            next_obs = rec["next_obs"]
        # Initial priority (Ape-X): |R + discount * max_a Q(s', a) - Q(s, a)| with this copy.
        bootstrap = np.array([b[0] for b in o_max_q_next], np.float64)
        todo = np.flatnonzero(np.isnan(bootstrap))
        if todo.size:
            bootstrap[todo] = self.q(next_obs[todo]).max(axis=1)
        td_abs = np.abs(rec["reward"] + rec["discount"] * bootstrap - np.array(o_qsa))
        buf = self.wire.experience(
            rec,
            td_abs,
            self.returns_to_send,
            self.env_steps - self.steps_reported,
            self.seq,
            frames=table,
            acting=self.weights_updates,
        )
        if self.fault.action == "wire" and self.fault.due("wire"):  # test hook: wrong version
            buf[6:8] = np.frombuffer(np.uint16(99).tobytes(), np.uint8)
        self.send_to_buffer(buf)
        out.drop(k)
        if flog is not None:  # forget frames nothing pending refers to any more
            pending = [i[0] for i in self.ids] + [row[0][0] for row in out.rows]
            pending += [st[0][0] for ns in self.nsteps for st in ns._steps]
            flog.prune(min(pending))
        self.returns_to_send.clear()
        self.steps_reported = self.env_steps
        self.seq += 1
        self.msgs += 1
        self.nbytes += buf.nbytes
        if not final:
            self.tokens -= 1

    # ---- report -------------------------------------------------------------------------------
    def paced_s(self) -> float:
        return self.paced_before + (self.pace.waited_s if self.pace is not None else 0.0)

    def report(self) -> None:
        """One /actor row per flush interval, on its own clock: an episode row that triggered
        the flush must not make this row skip a turn."""
        now = time.monotonic()
        if now >= self.next_row:
            self.next_row = now + self.cfg.flush_seconds
            self.actor_row()
        self.log.maybe_flush(now)

    def actor_row(self) -> None:
        self.logs["actor"].append(
            env_steps=self.env_steps,
            msgs_sent=self.msgs,
            bytes_sent=self.nbytes,
            throttled_s=self.throttled,
            weights_version=self.weights_version,
            paced_s=self.paced_s(),
            weights_updates=self.weights_updates,
        )

    # ---- checkpoint and stop ------------------------------------------------------------------
    def save(self, ckpt_id: int) -> None:
        """This actor's part of checkpoint ``ckpt_id``: everything needed to continue."""
        spec, out = self.spec, self.out
        k = len(out)
        cols = out.columns()
        # max_q_next (the seventh column) is not saved: a resume refills it with NaN
        arrays = {f"out_{n}": np.asarray(x) for n, x in zip(Outgoing.NAMES, cols, strict=False)}
        o_obs, o_next = cols[0], cols[3]
        if self.flog is not None:  # image run: frame ids -> indices into a saved frame table
            idx, arrays["out_frames"] = self.flog.pack(o_obs, o_next)
            arrays["out_obs"], arrays["out_next"] = idx[:, : spec.stack], idx[:, spec.stack :]
        else:
            arrays["out_obs"] = np.asarray(o_obs, spec.obs_dtype).reshape(k, *spec.obs_shape)
            arrays["out_next"] = np.asarray(o_next, spec.obs_dtype).reshape(k, *spec.obs_shape)
        arrays["returns_to_send"] = np.asarray(self.returns_to_send, np.float64)
        assert self.ckpt is not None  # CHECKPOINT and a final id come only to runs that save
        self.ckpt.write(
            ckpt_id,
            {
                "env_steps": self.env_steps,
                "steps_reported": self.steps_reported,
                "seq": self.seq,
                "msgs": self.msgs,
                "bytes_sent": self.nbytes,
                "throttled_s": self.throttled,
                "episodes": self.done_episodes,
                "paced_s": self.paced_s(),
                "epsilons": self.eps.tolist(),
                "rng": rng_meta(self.rng),
            },
            arrays,
        )

    def restore(self, part: Part) -> None:
        r, out = part.meta, self.out
        self.env_steps, self.steps_reported, self.seq = (
            r["env_steps"],
            r["steps_reported"],
            r["seq"],
        )
        self.msgs, self.nbytes, self.throttled = r["msgs"], r["bytes_sent"], r["throttled_s"]
        self.paced_before = r.get("paced_s", 0.0)
        self.done_episodes = r["episodes"]
        self.eps = np.asarray(r["epsilons"], np.float64)
        self.eps_list = self.eps.tolist()
        restore_rng(self.rng, r["rng"])
        cols = {
            n: (
                part.arrays[f"out_{n}"].tolist()
                if n not in ("obs", "next")
                else list(part.arrays[f"out_{n}"])
            )
            for n in Outgoing.NAMES
        }
        if self.flog is not None:  # frame ids again, in this actor's new FrameLog
            first = self.flog.adopt(part.arrays["out_frames"])
            for n in ("obs", "next"):
                cols[n] = [tuple(int(first + i) for i in row) for row in cols[n]]
        max_q_next = [[np.nan] for _ in cols["obs"]]  # bootstraps computed when sent
        out.extend(*(cols[n] for n in Outgoing.NAMES), max_q_next)
        self.returns_to_send.extend(part.arrays["returns_to_send"].tolist())

    def hand_over(self) -> None:
        """Clean stop: ship what is left, the final part, DONE; drain until the buffer's DONE
        comes back."""
        self.send_chunk(final=True)
        if self.final_ckpt >= 0:  # everything is sent: the part holds final counters only
            self.save(self.final_ckpt)
        self.send_to_buffer(self.wire.done(self.env_steps, self.done_episodes))
        acked: list[Message] = []  # the buffer's DONE; whatever else it sent meanwhile is dropped
        drain: dict[Tag, Callable[[Message], None]] = {
            t: acked.append if t == Tag.DONE else _drop for t in Tag
        }
        while not acked or self.site.backlog:
            if self.site.inbox.serve(drain, source=BUFFER):
                continue
            self.site.poll()
            self.backoff.idle()
        self.actor_row()
        self.log.set_attrs(env_steps=self.env_steps, episodes=self.done_episodes)
        for e in self.envs:
            e.close()


def _drop(m: Message) -> None:
    """A message the actor no longer acts on (after its DONE)."""


def wire_nbytes_weights(wire: Wire) -> int:
    return 40 + 4 * wire.n_params
