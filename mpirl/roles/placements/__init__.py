"""Where the prioritized replay memory lives (``--replay-at``): each placement is one module with
a buffer side and a learner side, and the wiring (`mpirl.wiring`) picks the pair once; the roles
never branch on it.

========  =========================================  ==========================================
module    buffer side (`SiteSide`)                   learner side (`BatchSource`)
========  =========================================  ==========================================
buffer    `at_buffer.SiteMemory`: the memory; sends  `at_buffer.LinkBatches`: trains the sites'
          sampled batches, applies priorities        batches in fair order, sends priorities
learner   `at_learner.SiteForwarding`: forwards      `at_learner.LocalMemory`: the memory (or a
          every experience against tokens            shard of it); samples its own batches
thinned   `thinned.SiteThinning`: forwards each      `thinned.ThinnedMemory`: the memory, each
          experience with probability f_i (its       slot's f_i; importance weights divided by
          priority, the rho- and link-budgets)       it too (unbiased over all produced)
========  =========================================  ==========================================

A module provides ``site_side(SiteContext)``, ``batch_source(LearnerContext)``,
``worker_shard(cfg, spec, record, k, index, seed)`` (a group learner's shard, or None) and
``edge_memory_bytes(cfg, spec)`` (what the buffer's checkpoint writes beyond its counters).  A new
placement is one more module and one more flag value in `PLACEMENTS`.  Both sides share the replay
ratio's rule, `mpirl.replay.rate_limiter.RateLimiter`.
"""

from __future__ import annotations

from types import ModuleType

from mpirl.roles.placements import at_buffer, at_learner, thinned

#: ``--replay-at`` value -> its module
PLACEMENTS: dict[str, ModuleType] = {
    "buffer": at_buffer,
    "learner": at_learner,
    "thinned": thinned,
}


def pick(replay_at: str) -> ModuleType:
    return PLACEMENTS[replay_at]
