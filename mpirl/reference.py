"""The whole of mpirl's DQN in one process, no MPI: read this first.

    python -m mpirl.reference [--seed 0] [--max-seconds 60] [--target-return 475] [...]

The same pieces as ``mpirun -n 3 python -m mpirl.main``, in one loop (CleanRL's single file): the
actor's envs (`mpirl.agent.envs.make`, Ape-X epsilon per env, one batched numpy forward), its
n-step returns (`NStep`) and initial priorities ``|R + discount max_a Q(s', a) - Q(s, a)|``, the
prioritized replay memory (`make_replay`), the learner's train step (`TrainStep`) and greedy
evaluation (`Evaluator`, the learner's seeds).  After ``learning_starts`` transitions it trains
``replay_ratio`` samples per inserted transition, the ratio the distributed run's rate limiter
holds (0: one update per env turn).  The flags are mpirl.main's; those of MPI, the link and the
logs do nothing here.  Vector observations only.
"""

from __future__ import annotations

import math
import sys
import time
from collections import deque
from typing import TYPE_CHECKING

import numpy as np

from mpirl import seeds
from mpirl.agent import envs
from mpirl.agent.device import resolve
from mpirl.agent.nstep import NStep
from mpirl.agent.qnet import make_q
from mpirl.agent.train_step import TrainStep
from mpirl.replay.build import beta_at, make_replay, record_dtype
from mpirl.roles.actor import epsilon
from mpirl.run.config import Config, ConfigError, parse

if TYPE_CHECKING:
    from collections.abc import Callable

    from mpirl.agent.envs import EnvSpec
    from mpirl.replay.memory import Sample


def learner(
    cfg: Config, spec: EnvSpec
) -> tuple[Callable[[Sample], tuple[float, np.ndarray]], Callable[[], np.ndarray]]:
    """The learner's own train step (`TrainStep`): ``update(batch) -> (loss, |td|)`` and
    ``weights() -> the online network's flat parameters``.  The one place that touches it."""
    import torch

    step = TrainStep(cfg, spec, resolve(cfg.device, torch), cfg.amp)

    def update(batch: Sample) -> tuple[float, np.ndarray]:
        return step.launch(step.put(batch.records, batch.weights)).result()

    return update, step.online.flat_params


def act(
    q: Callable[[np.ndarray], np.ndarray],
    obs: np.ndarray,
    n_actions: int,
    eps: np.ndarray,
    rng: np.random.Generator,
) -> np.ndarray:
    """Greedy actions; env j takes a uniform random one with probability eps[j] (the actor's
    draw: 2m uniforms per turn)."""
    n_envs = len(obs)
    u = rng.random(2 * n_envs)
    explore = np.minimum((u[n_envs:] * n_actions).astype(np.int64), n_actions - 1)
    return np.where(u[:n_envs] < eps, explore, q(obs).argmax(axis=1))


def records(
    q: Callable[[np.ndarray], np.ndarray], transitions: list[tuple], dtype: np.dtype
) -> tuple[np.ndarray, np.ndarray]:
    """n-step transitions -> (records, initial |td| under the acting network)."""
    obs, action, reward, next_obs, discount, _ = zip(*transitions, strict=True)
    rec = np.empty(len(transitions), dtype)
    rec["obs"], rec["action"], rec["reward"] = obs, action, reward
    rec["next_obs"], rec["discount"] = next_obs, discount
    q_sa = q(rec["obs"])[np.arange(len(rec)), rec["action"]]
    return rec, np.abs(rec["reward"] + rec["discount"] * q(rec["next_obs"]).max(axis=1) - q_sa)


def updates_due(cfg: Config, inserted: int, updates: int) -> int:
    """Updates the rate limiter allows now: ``replay_ratio`` samples per transition inserted
    after the first ``learning_starts`` (replay_ratio 0: one per env turn), within
    ``max_updates``."""
    learned = inserted - cfg.learning_starts
    if learned < 0:
        return 0
    due = (
        math.ceil(cfg.replay_ratio * learned / cfg.batch_size) - updates if cfg.replay_ratio else 1
    )
    return max(0, min(due, cfg.max_updates - updates) if cfg.max_updates else due)


def stop_reason(
    cfg: Config, target: float | None, best: float, env_steps: int, updates: int, seconds: float
) -> str | None:
    """Why the run stops now, in the learner's order (target, then the budgets), or None."""
    if target is not None and best >= target:
        return "target_return"
    if cfg.max_env_steps and env_steps >= cfg.max_env_steps:
        return "max_env_steps"
    if cfg.max_updates and updates >= cfg.max_updates:
        return "max_updates"
    if cfg.max_seconds and seconds >= cfg.max_seconds:
        return "max_seconds"
    return None


def run(cfg: Config, say: Callable[[str], None] = print) -> dict:
    """Train until the target return or a budget; the summary (rates, evaluations)."""
    import torch

    spec = envs.inspect(cfg.env, cfg.env_kwargs, cfg.wrapper_specs())
    if spec.image:
        raise ConfigError(f"env={cfg.env!r}: mpirl.reference plays vector observations only")
    torch.set_num_threads(cfg.torch_threads)
    own = seeds.learner(cfg.seed, 1, cfg.eval_episodes)
    mine = seeds.actor(cfg.seed, 2, 0, 1, cfg.envs_per_actor)  # the actor of mpirun -n 3
    torch.manual_seed(own["torch"])
    update, weights = learner(cfg, spec)
    memory = make_replay(cfg, spec, record_dtype(cfg, spec), seed=own["replay"])
    kw, wrappers = cfg.env_kwargs, cfg.wrapper_specs()
    evaluator = envs.Evaluator(
        cfg.env, cfg.eval_episodes, cfg.seed, cfg.eval_max_steps, kw, wrappers
    )
    game = [envs.make(cfg.env, s, kw, wrappers) for s in mine["envs"]]
    n_envs = len(game)
    eps = np.array([epsilon(j, n_envs, cfg.eps_base, cfg.eps_alpha) for j in range(n_envs)])
    nstep = [NStep(cfg.n_step, cfg.gamma) for _ in game]
    rng = np.random.default_rng(mine["exploration"])
    q = make_q(spec, cfg.hidden, cfg.dueling)  # the actor's numpy copy of the online network
    q.load(weights())
    target = cfg.target_return if cfg.target_return is not None else spec.reward_threshold
    target = target if target is not None and np.isfinite(target) else None

    obs = np.stack([e.reset(seed=s)[0] for e, s in zip(game, mine["envs"], strict=True)])
    returns: deque[float] = deque(maxlen=100)  # the last episodes' returns
    ep_ret, pending, evals, progress = [0.0] * n_envs, [], [], []
    env_steps = updates = 0
    loss, best, stop = float("nan"), float("-inf"), None
    t0 = time.monotonic()
    last = (t0, 0, 0)  # time, env steps, updates at the last progress line
    while stop is None:
        actions = act(q, obs, spec.n_actions, eps, rng)
        for j, env in enumerate(game):  # step, n-step
            a = actions[j]
            nxt, r, term, trunc, _ = env.step(a)
            ep_ret[j] += float(r)
            pending += nstep[j].push(obs[j].copy(), a, r, nxt, term, trunc)
            if term or trunc:
                returns.append(ep_ret[j])
                ep_ret[j] = 0.0
                nxt, _ = env.reset()
            obs[j] = nxt
        env_steps += n_envs
        if len(pending) >= cfg.actor_chunk:  # into the replay memory, as a chunk ships
            memory.add(*records(q, pending, memory.dtype))
            pending.clear()
        for _ in range(updates_due(cfg, memory.inserted, updates)):  # train
            memory.beta = beta_at(cfg, updates)
            batch = memory.sample(cfg.batch_size)
            loss, td = update(batch)
            memory.update(batch.indices, batch.generations, td)
            updates += 1
            q.load(weights())
            if updates % cfg.eval_every == 0:  # greedy evaluation
                evals.append((updates, env_steps, float(evaluator.run(q).mean())))
                best = max(best, evals[-1][2])
        now = time.monotonic()
        stop = stop_reason(cfg, target, best, env_steps, updates, now - t0)
        if cfg.progress_seconds and now - last[0] >= cfg.progress_seconds:  # as the learner's
            dt, d_steps, d_updates = now - last[0], env_steps - last[1], updates - last[2]
            last = (now, env_steps, updates)
            progress.append((now - t0, env_steps, updates, time.process_time()))
            say(
                f"[{now - t0:7.1f}s] env steps {env_steps:>10,} ({d_steps / dt:,.0f}/s) | "
                f"updates {updates:>8,} ({d_updates / dt:,.0f}/s) | return "
                f"{np.mean(returns) if returns else np.nan:7.1f} | eval {best:7.1f} | "
                f"loss {loss:.4f}"
            )
    wall = time.monotonic() - t0
    say(
        f"mpirl: stopping ({stop}) after {wall:.1f} s, {env_steps:,} env steps, "
        f"{updates:,} updates, best eval {best:.1f}"
    )
    evaluator.close()
    for env in game:
        env.close()
    return {
        "stop_reason": stop,
        "target_return": target,
        "wall_s": wall,
        "env_steps": env_steps,
        "updates": updates,
        "best_eval": best,
        "evals": evals,  # (updates, env steps, mean return) of each evaluation
        "progress": progress,  # (seconds, env steps, updates, process CPU s) of each line
    }


def main(argv: list[str] | None = None) -> int:
    """mpirl.main's flags -> one run; a bad value is one line on stderr and exit status 2."""
    try:
        run(parse(argv), lambda line: print(line, flush=True))
    except ConfigError as e:
        print(f"mpirl.reference: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
