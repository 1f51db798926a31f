"""The user's env code failing while ``--reference-set auto`` collects its set on rank 0
(tests/test_refset_errors.py): a wrapper whose env builds and resets, then raises after a few
steps, as a bug in one's own env would."""

import gymnasium as gym


class _Breaks(gym.Wrapper):
    def __init__(self, env, after: int = 20):
        super().__init__(env)
        self.after, self.steps = after, 0

    def step(self, action):
        self.steps += 1
        if self.steps > self.after:
            raise KeyError("the user's env broke")
        return self.env.step(action)


def breaks_after_20(env):
    return _Breaks(env)
