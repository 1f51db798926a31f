"""Gymnasium environments: creation, checks (DQN needs a discrete action space), eval."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class EnvSpec:
    obs_shape: tuple[int, ...]
    obs_dtype: np.dtype
    n_actions: int
    reward_threshold: float | None


def make(env_id: str, seed: int | None = None):
    import gymnasium as gym

    from mpirl.config import ConfigError

    try:
        env = gym.make(env_id)
    except gym.error.Error as e:
        raise ConfigError(f"env={env_id!r} is not a gymnasium environment id ({e}); pick one "
                          "from gymnasium.envs.registry, e.g. --env CartPole-v1") from None
    if not isinstance(env.action_space, gym.spaces.Discrete):
        env.close()
        raise ConfigError(f"env={env_id!r} has action space {env.action_space}; DQN needs a "
                          "Discrete action space (pick a discrete env, e.g. CartPole-v1)")
    if not isinstance(env.observation_space, gym.spaces.Box):
        env.close()
        raise ConfigError(f"env={env_id!r} has observation space {env.observation_space}; "
                          "mpirl needs a Box observation space")
    if seed is not None:
        env.action_space.seed(seed)
    return env


def inspect(env_id: str) -> EnvSpec:
    env = make(env_id)
    spec = EnvSpec(tuple(env.observation_space.shape), np.dtype(env.observation_space.dtype),
                   int(env.action_space.n), getattr(env.spec, "reward_threshold", None))
    env.close()
    if len(spec.obs_shape) != 1:
        from mpirl.config import ConfigError

        raise ConfigError(f"env={env_id!r} has observation shape {spec.obs_shape}; only vector "
                          "observations (1-D Box) are supported so far")
    return spec


class Evaluator:
    """Greedy evaluation: ``episodes`` envs stepped in lockstep with one batched forward."""

    def __init__(self, env_id: str, episodes: int, seed: int):
        self.envs = [make(env_id) for _ in range(episodes)]
        self.seed = seed
        self.round = 0

    def run(self, q) -> np.ndarray:
        """Mean-able array of the episodes' undiscounted returns under argmax q."""
        n = len(self.envs)
        obs = np.stack([e.reset(seed=self.seed + 7919 * self.round + i)[0]
                        for i, e in enumerate(self.envs)])
        self.round += 1
        returns = np.zeros(n)
        live = np.ones(n, bool)
        while live.any():
            idx = np.flatnonzero(live)
            actions = q(obs[idx]).argmax(axis=1)
            for j, a in zip(idx, actions):
                o, r, term, trunc, _ = self.envs[j].step(int(a))
                returns[j] += r
                obs[j] = o
                if term or trunc:
                    live[j] = False
        return returns

    def close(self):
        for e in self.envs:
            e.close()
