"""Actor rank: steps gymnasium environments and sends n-step experiences to its site's buffer.

Per loop turn: [comm] take what the buffer sent (weights, tokens, stop) without blocking;
[algorithm] one batched greedy forward over this actor's envs, Ape-X epsilon per env, one step
each, n-step accumulation; [comm] when a chunk is full and a token is free, compute the chunk's
initial priorities with this actor's network copy and ``Isend`` it.

Flow control (token control): an actor may have ``actor_credits`` experience messages that the
buffer has not yet granted back.  Without a token it keeps stepping until ``4 * actor_chunk``
transitions are waiting, then waits for a token (backpressure; the wait is counted as throttled
time and the CPU goes to other ranks).

Checkpoints: on CHECKPOINT the actor writes its part (counters, epsilons, RNG state and the
transitions it has not sent yet) and acknowledges; on STOP with a checkpoint id it writes its
final part before DONE.  Resumed, it continues those counters with fresh episodes (env states
are not saved: the episodes in progress and their incomplete n-step windows are dropped).

Image observations (see mpirl.frames): every frame gets an id in this actor's ``FrameLog``; the
n-step accumulator and the outgoing lists hold stacks of ids, and a message carries each frame
it refers to once.  Rewards of image envs are clipped to [-1, 1] before the n-step sum (the
episode returns logged stay unclipped); with ``--episodic-life`` a lost life ends the n-step
return (discount 0) while the game goes on.  Image runs act with the torch CNN (imported here
only then); vector runs keep NumpyQ and never import torch.
"""

from __future__ import annotations

import time

import numpy as np
from mpi4py import MPI

from mpirl import envs as envs_mod
from mpirl import failure, seeds
from mpirl.checkpoint import restore_rng, rng_meta
from mpirl.frames import FrameLog, stacks
from mpirl.logs import Field, RunLog
from mpirl.nstep import NStep
from mpirl.pacing import TokenBucket
from mpirl.qnet import make_q
from mpirl.waiting import Backoff
from mpirl.wire import Tag, Wire

BUFFER = 0  # the site's buffer is site rank 0

POLL_S = 0.0005  # seconds between MPI polls of an actor that holds tokens


def epsilon(i: int, n: int, base: float, alpha: float) -> float:
    """Ape-X per-env exploration: eps_i = base^(1 + alpha * i / (n - 1))."""
    return base ** (1 + alpha * i / (n - 1)) if n > 1 else base


def run(cfg, topo, spec, wire: Wire, log: RunLog, ckpt=None, resume=None) -> None:
    comm = topo.site
    me = topo.place
    m = cfg.envs_per_actor
    n_total = topo.n_actors * m
    fault = failure.FAULT
    # a resumed run starts fresh episodes, seeded apart from those of earlier launches
    seed = seeds.actor(cfg.seed, me.rank, m, None if resume is None else resume.id)
    rng = np.random.default_rng(seed["exploration"])
    envs = [envs_mod.make(cfg.env, seed=s, kwargs=cfg.env_kwargs, wrappers=cfg.wrapper_specs())
            for s in seed["envs"]]
    eps = np.array([epsilon(me.index * m + j, n_total, cfg.eps_base, cfg.eps_alpha)
                    for j in range(m)])
    nsteps = [NStep(cfg.n_step, cfg.gamma) for _ in range(m)]
    q = make_q(spec, cfg.hidden, cfg.dueling)
    flog = FrameLog(spec.stack, spec.frame_shape) if spec.image else None
    ids: list = [None] * m  # image runs: the current stack of frame ids per env
    lives = np.zeros(m, np.int64)
    episodic_life = cfg.episodic_life and spec.family == "atari"

    episodes = log.stream("episodes", [
        Field("env", "i4", "", "env index within this actor"),
        Field("ret", "f8", "reward", "undiscounted episode return"),
        Field("length", "i8", "steps", "episode length"),
        Field("epsilon", "f4", "", "exploration rate of this env"),
    ], doc="episodes finished by this actor's envs")
    progress = log.stream("actor", [
        Field("env_steps", "i8", "steps", "env steps by this actor so far"),
        Field("msgs_sent", "i8", "messages", "experience messages sent"),
        Field("bytes_sent", "i8", "bytes", "experience bytes sent"),
        Field("throttled_s", "f8", "s", "time spent waiting for a token (backpressure)"),
        Field("paced_s", "f8", "s", "time spent sleeping to hold --actor-steps-per-s"),
        Field("weights_version", "i8", "", "version of the weights in use"),
    ], doc="actor counters, about once per flush")
    log.set_attrs(epsilons=eps)

    status = MPI.Status()
    wbuf = np.empty(wire_nbytes_weights(wire), np.uint8)
    sends: list = []  # (request, buffer) in flight
    tokens = cfg.actor_credits
    backoff = Backoff()
    weights_version = -1
    stop = False
    env_steps = steps_reported = seq = msgs = nbytes = 0
    throttled = 0.0
    paced_before = 0.0  # pacing sleep of earlier launches (resumed runs)
    pace = None  # --actor-steps-per-s: a token per env step, started with the first weights

    def paced_s() -> float:
        return paced_before + (pace.waited_s if pace is not None else 0.0)
    done_episodes = 0
    out_obs, out_act, out_ret, out_next, out_disc, out_qsa = [], [], [], [], [], []
    # max_a Q(s', a) for each outgoing transition, in a one-element box: filled by the next acting
    # forward of its env (s' is the observation acted on next), so an image run does not run the
    # CNN twice over every state; boxes still NaN at send time (s' ended the episode, or the
    # chunk leaves before the next forward) are computed then.
    out_boot: list = []
    waiting: list[list] = [[] for _ in range(m)]  # per env: boxes its next forward fills
    returns_to_send: list[float] = []
    final_ckpt = -1
    outs = ("obs", "act", "ret", "next", "disc", "qsa")

    def save(ckpt_id: int) -> None:
        """This actor's part of checkpoint ``ckpt_id``: everything needed to continue."""
        k = len(out_obs)
        lists = (out_obs, out_act, out_ret, out_next, out_disc, out_qsa)
        arrays = {f"out_{n}": np.asarray(x) for n, x in zip(outs, lists)}
        if flog is not None:  # image run: frame ids -> indices into a saved frame table
            idx, arrays["out_frames"] = flog.pack(out_obs, out_next)
            arrays["out_obs"], arrays["out_next"] = idx[:, :spec.stack], idx[:, spec.stack:]
        else:
            arrays["out_obs"] = np.asarray(out_obs, spec.obs_dtype).reshape(k, *spec.obs_shape)
            arrays["out_next"] = np.asarray(out_next, spec.obs_dtype).reshape(k, *spec.obs_shape)
        arrays["returns_to_send"] = np.asarray(returns_to_send, np.float64)
        ckpt.write(ckpt_id, {
            "env_steps": env_steps, "steps_reported": steps_reported, "seq": seq, "msgs": msgs,
            "bytes_sent": nbytes, "throttled_s": throttled, "episodes": done_episodes,
            "paced_s": paced_s(),
            "epsilons": eps.tolist(), "rng": rng_meta(rng)}, arrays)

    if resume is not None:
        r = resume.meta
        env_steps, steps_reported, seq = r["env_steps"], r["steps_reported"], r["seq"]
        msgs, nbytes, throttled = r["msgs"], r["bytes_sent"], r["throttled_s"]
        paced_before = r.get("paced_s", 0.0)
        done_episodes = r["episodes"]
        eps = np.asarray(r["epsilons"], np.float64)
        restore_rng(rng, r["rng"])
        for n, lst in zip(outs, (out_obs, out_act, out_ret, out_next, out_disc, out_qsa)):
            lst.extend(resume.arrays[f"out_{n}"].tolist() if n not in ("obs", "next")
                       else list(resume.arrays[f"out_{n}"]))
        out_boot.extend([np.nan] for _ in out_obs)  # bootstraps computed when sent
        if flog is not None:  # frame ids again, in this actor's new FrameLog
            first = flog.adopt(resume.arrays["out_frames"])
            out_obs[:] = [tuple(int(first + i) for i in row) for row in out_obs]
            out_next[:] = [tuple(int(first + i) for i in row) for row in out_next]
        returns_to_send.extend(resume.arrays["returns_to_send"].tolist())

    def receive_all() -> None:
        nonlocal tokens, weights_version, stop, final_ckpt
        while True:
            msg = comm.Improbe(source=BUFFER, tag=MPI.ANY_TAG, status=status)
            if msg is None:
                return
            tag, n = status.Get_tag(), status.Get_count(MPI.BYTE)
            buf = wbuf if (tag == Tag.WEIGHTS and n == wbuf.nbytes) else np.empty(n, np.uint8)
            msg.Recv([buf, MPI.BYTE])
            m_ = wire.unpack(buf, tag, f"buffer of site {me.site}")
            if m_.kind == Tag.WEIGHTS:
                q.load(m_.arrays["params"])
                weights_version = m_.seq
            elif m_.kind == Tag.CREDIT:
                tokens += m_.count
            elif m_.kind == Tag.STOP:
                stop = True
                final_ckpt = m_.seq
            elif m_.kind == Tag.CHECKPOINT:  # snapshot between two steps, then acknowledge
                save(m_.seq)
                ack = wire.checkpoint(m_.seq, env_steps)
                sends.append((comm.Isend([ack, MPI.BYTE], dest=BUFFER, tag=Tag.CHECKPOINT), ack))
            else:
                raise RuntimeError(f"actor rank {me.rank}: unexpected {m_.kind.name} from buffer")

    def send_chunk(final: bool = False) -> None:
        """Pack up to actor_chunk transitions with initial priorities; Isend to the buffer."""
        nonlocal tokens, seq, msgs, nbytes, steps_reported
        k = len(out_obs) if final else cfg.actor_chunk
        if k == 0 and not returns_to_send and env_steps == steps_reported:
            return
        rec = np.empty(k, wire.record)
        rec["action"] = out_act[:k]
        rec["reward"] = out_ret[:k]
        rec["discount"] = out_disc[:k]
        table = None
        if flog is not None:  # image run: each frame once, records index the table
            rec["frames"], table = flog.pack(out_obs[:k], out_next[:k])
            next_obs = stacks(rec, table, spec.stack)[1]
        elif k:  # a final message may carry only returns and step counts
            rec["obs"] = out_obs[:k]
            rec["next_obs"] = out_next[:k]
            next_obs = rec["next_obs"]
        # Initial priority (Ape-X): |R + discount * max_a Q(s', a) - Q(s, a)| with this copy.
        bootstrap = np.array([b[0] for b in out_boot[:k]], np.float64)
        todo = np.flatnonzero(np.isnan(bootstrap))
        if todo.size:
            bootstrap[todo] = q(next_obs[todo]).max(axis=1)
        td_abs = np.abs(rec["reward"] + rec["discount"] * bootstrap - np.asarray(out_qsa[:k]))
        buf = wire.experience(rec, td_abs, returns_to_send, env_steps - steps_reported, seq,
                              frames=table)
        if fault.action == "wire" and fault.due("wire"):  # test hook: a wrong wire version
            buf[6:8] = np.frombuffer(np.uint16(99).tobytes(), np.uint8)
        sends.append((comm.Isend([buf, MPI.BYTE], dest=BUFFER, tag=Tag.EXPERIENCE), buf))
        for lst in (out_obs, out_act, out_ret, out_next, out_disc, out_qsa, out_boot):
            del lst[:k]
        if flog is not None:  # forget frames nothing pending refers to any more
            pending = [i[0] for i in ids] + [o[0] for o in out_obs]
            pending += [st[0][0] for ns in nsteps for st in ns._steps]
            flog.prune(min(pending))
        returns_to_send.clear()
        steps_reported = env_steps
        seq += 1
        msgs += 1
        nbytes += buf.nbytes
        if not final:
            tokens -= 1

    # [comm] wait for the first weights so no env step is taken with an untrained zero network
    while weights_version < 0 and not stop:
        receive_all()
        backoff.idle()

    if cfg.actor_steps_per_s:  # P = actors x this, whatever the placement
        pace = TokenBucket(cfg.actor_steps_per_s, take=m)
    first = [e.reset(seed=s) for s, e in zip(seed["envs"], envs)]
    obs = np.stack([o for o, _ in first])
    for j, (o, info) in enumerate(first):
        lives[j] = info.get("lives", 0)
        if flog is not None:
            ids[j] = flog.reset(o)
    ep_ret = [0.0] * m  # Python numbers: numpy scalar arithmetic per env step costs more
    ep_len = [0] * m
    rows = np.arange(m)
    first_step = True
    next_row = time.monotonic() + cfg.flush_seconds
    t_polled = 0.0
    while not stop:
        fault.check()
        # [comm] tokens, weights, stop: never blocks; while tokens last, at most every
        # POLL_S (an Improbe per 4-env turn was ~5% of the actor's time)
        t_turn = time.monotonic()
        if tokens <= 0 or t_turn - t_polled >= POLL_S:
            receive_all()
            t_polled = t_turn
        if sends:
            sends[:] = [(r, b) for r, b in sends if not r.Test()]
        # [comm] backpressure: too much waiting and no token -> wait for the buffer
        if len(out_obs) >= 4 * cfg.actor_chunk and tokens <= 0:
            t0 = time.monotonic()
            backoff.idle()
            throttled += time.monotonic() - t0
            continue
        # [pacing] one token per env step of this turn; without them, sleep (at most the
        # back-off ceiling, so stop and weights are still served)
        if pace is not None and not pace.try_take(t_turn):
            pace.wait(backoff.ceiling)
            continue
        backoff.work()
        # [algorithm] act: one batched forward, epsilon-greedy per env
        qv = q(obs)
        best = qv.max(axis=1).tolist()  # one reduction for every env's waiting boxes
        for j in range(m):
            if waiting[j]:
                for box in waiting[j]:
                    box[0] = best[j]
                waiting[j].clear()
        actions = qv.argmax(axis=1)
        explore = rng.random(m) < eps
        if explore.any():  # (Generator.integers' size handling costs more than the draw)
            actions[explore] = rng.integers(0, spec.n_actions, int(explore.sum()))
        q_sa = qv[rows, actions].tolist()
        actions = actions.tolist()
        for j, env in enumerate(envs):
            a = actions[j]
            nxt, r, term, trunc, info = env.step(a)
            env_steps += 1
            ep_ret[j] += float(r)  # float64 sums whatever the env's reward type
            ep_len[j] += 1
            if spec.clip_rewards:
                r = float(np.clip(r, -1.0, 1.0))
            life_lost = False
            if episodic_life:
                life_lost = 0 < info.get("lives", 0) < lives[j]
                lives[j] = info.get("lives", 0)
            if flog is not None:
                s_ids, ids[j] = ids[j], flog.step(ids[j], nxt)
                here, there = s_ids, ids[j]
            else:
                here, there = obs[j].copy(), nxt
            for t in nsteps[j].push(here, a, r, there, term or life_lost, trunc,
                                    q_sa[j]):
                out_obs.append(t[0])
                out_act.append(t[1])
                out_ret.append(t[2])
                out_next.append(t[3])
                out_disc.append(t[4])
                out_qsa.append(t[5])
                box = [0.0 if t[4] == 0.0 else np.nan]
                if t[4] != 0.0 and not (term or trunc):
                    waiting[j].append(box)  # s' = nxt, acted on at the next forward
                out_boot.append(box)
            if term or trunc:
                episodes.append(env=j, ret=ep_ret[j], length=ep_len[j], epsilon=eps[j])
                returns_to_send.append(ep_ret[j])
                done_episodes += 1
                ep_ret[j], ep_len[j] = 0.0, 0
                nxt, info = env.reset()
                lives[j] = info.get("lives", 0)
                if flog is not None:
                    ids[j] = flog.reset(nxt)
            obs[j] = nxt
        if first_step:  # where start-up ends, on the wall clock (bench/overheads.py reads it)
            log.set_attrs(first_step_unix=time.time())
            first_step = False
        # [comm] ship full chunks while tokens last
        while len(out_obs) >= cfg.actor_chunk and tokens > 0:
            send_chunk()
        # [log] one /actor row per flush interval, on its own clock: an episode row that
        # triggered the flush must not make this row skip a turn
        now = time.monotonic()
        if now >= next_row:
            next_row = now + cfg.flush_seconds
            progress.append(env_steps=env_steps, msgs_sent=msgs, bytes_sent=nbytes,
                            throttled_s=throttled, weights_version=weights_version,
                            paced_s=paced_s())
        log.maybe_flush(now)

    # [comm] clean stop: ship what is left, say DONE, drain until the buffer's DONE comes back
    send_chunk(final=True)
    if final_ckpt >= 0:  # everything is sent: the part holds final counters only
        save(final_ckpt)
    done = wire.done(env_steps, done_episodes)
    sends.append((comm.Isend([done, MPI.BYTE], dest=BUFFER, tag=Tag.DONE), done))
    acked = False
    while not acked or sends:
        msg = comm.Improbe(source=BUFFER, tag=MPI.ANY_TAG, status=status)
        if msg is not None:
            buf = np.empty(status.Get_count(MPI.BYTE), np.uint8)
            msg.Recv([buf, MPI.BYTE])
            acked = acked or status.Get_tag() == Tag.DONE
            continue
        sends[:] = [(r, b) for r, b in sends if not r.Test()]
        backoff.idle()
    progress.append(env_steps=env_steps, msgs_sent=msgs, bytes_sent=nbytes,
                    throttled_s=throttled, weights_version=weights_version, paced_s=paced_s())
    log.set_attrs(env_steps=env_steps, episodes=done_episodes)
    for e in envs:
        e.close()


def wire_nbytes_weights(wire: Wire) -> int:
    return 40 + 4 * wire.n_params
