"""n-step returns, computed at the actors (pure, no MPI).

For a step at time t the transition sent to the replay memory is::

    (s_t, a_t, R = sum_{i<k} gamma^i r_{t+i}, s_{t+k}, discount = gamma^k * (1 - terminated))

with k = n, or fewer when the episode ends first.  A terminated episode bootstraps from nothing
(discount 0); a truncated one (time limit) bootstraps from its last observation, as it should.
"""

from __future__ import annotations

from collections import deque
from typing import Any, SupportsFloat

#: where each field sits in a transition tuple ``(obs, action, R, next_obs, discount, q_sa)``
OBS, ACTION, RETURN, NEXT_OBS, DISCOUNT, Q_SA = range(6)


class NStep:
    """n-step accumulator for one environment."""

    def __init__(self, n: int, gamma: float) -> None:
        if n < 1:
            raise ValueError(f"n_step={n} must be >= 1")
        self.n, self.gamma = n, gamma
        self._steps: deque = deque()  # (obs, action, reward, q_sa)

    def push(
        self,
        obs: Any,
        action: Any,
        reward: SupportsFloat,
        next_obs: Any,
        terminated: bool,
        truncated: bool,
        q_sa: float = 0.0,
    ) -> list[tuple]:
        """Add one step; return the transitions that are complete.

        Each is ``(obs, action, R, next_obs, discount, q_sa)``; ``q_sa`` is the actor's Q(s,a)
        at acting time, carried along so the initial priority needs no second forward pass.
        """
        self._steps.append((obs, action, float(reward), q_sa))
        out: list[tuple] = []
        if terminated or truncated:
            while self._steps:
                out.append(self._emit(next_obs, terminated))
        elif len(self._steps) == self.n:
            out.append(self._emit(next_obs, False))
        return out

    def _emit(self, next_obs: Any, terminated: bool) -> tuple:
        ret, g = 0.0, 1.0
        for _, _, r, _ in self._steps:
            ret += g * r
            g *= self.gamma
        obs, action, _, q_sa = self._steps.popleft()
        return obs, action, ret, next_obs, 0.0 if terminated else g, q_sa

    def clear(self) -> None:
        self._steps.clear()
