"""A user's own environment, as the README's "Your own environment" describes: importing this
module registers ``MpirlSignal-v0``, so ``--env toy_env:MpirlSignal-v0`` works on every rank
that has this folder on PYTHONPATH; it also holds wrappers for ``--env-wrappers``.
"""

import gymnasium as gym
import numpy as np


class Signal(gym.Env):
    """A contextual bandit: the observation shows one of ``n`` signals (one-hot); action ==
    signal earns 1, any other action 0; an episode is ``length`` steps."""

    def __init__(self, n: int = 2, length: int = 20, continuous: bool = False):
        self.n, self.length = n, length
        self.observation_space = gym.spaces.Box(0.0, 1.0, (n,), np.float32)
        self.action_space = (
            gym.spaces.Box(-1.0, 1.0, (1,), np.float32) if continuous else gym.spaces.Discrete(n)
        )
        self.signal = self.t = 0

    def _obs(self):
        o = np.zeros(self.n, np.float32)
        o[self.signal] = 1.0
        return o

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t, self.signal = 0, int(self.np_random.integers(self.n))
        return self._obs(), {}

    def step(self, action):
        reward = float(int(action) == self.signal)
        self.t += 1
        self.signal = int(self.np_random.integers(self.n))
        return self._obs(), reward, False, self.t >= self.length, {}


gym.register("MpirlSignal-v0", entry_point=Signal)


def plus_one(env):
    """reward + 1; applied before `double`, a step earns 2 or 4 (an even return), after it 1 or
    3 (an odd return over an odd number of steps)."""
    return gym.wrappers.TransformReward(env, lambda r: r + 1)


def double(env):
    return gym.wrappers.TransformReward(env, lambda r: 2 * r)


NOT_CALLABLE = 3
