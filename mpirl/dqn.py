"""The DQN loss (pure torch, no MPI): double DQN target, Huber loss weighted by importance weights.

Given a batch of n-step transitions (s, a, R, s', discount) the target is::

    y = R + discount * Q_target(s', argmax_a Q_online(s', a))

and the loss is ``mean_i w_i * huber(Q_online(s_i, a_i) - y_i)``.  The function returns the new
priorities' raw material, |td| per sample, beside the loss (as Acme's losses do).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def dqn_loss(online, target, obs, action, reward, next_obs, discount, weights,
             huber_delta: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    n = obs.shape[0]
    q_both = online(torch.cat([obs, next_obs]))  # one forward for s and s'
    q = q_both[:n].gather(1, action.view(-1, 1)).squeeze(1)
    with torch.no_grad():
        a_star = q_both[n:].argmax(dim=1, keepdim=True)
        q_next = target(next_obs).gather(1, a_star).squeeze(1)
        y = reward + discount * q_next
    td = q - y
    per_sample = F.huber_loss(q, y, reduction="none", delta=huber_delta)
    loss = (weights * per_sample).mean()
    return loss, td.detach().abs()
