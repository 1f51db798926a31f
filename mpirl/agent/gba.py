"""Global-batch gradient aggregation (GBA, Su et al. 2022) for the learner group: pure, no MPI.

The lead learner acts as GBA's parameter server.  Every learner computes gradients on its own
batches, each on the weights of some version ``v`` (the number of updates the lead had applied
when those weights were taken); the lead hands each gradient to a `GlobalBatch` as a
`Contribution`.  An update is applied once ``samples`` (K x batch) samples' worth of gradients is
assembled (token control: a contribution is a token, a batch of ``n`` samples):

* staleness ``s = version_now - v`` (updates applied since the contribution's weights);
* **drop** a contribution with ``s > max_staleness`` (its samples do not count toward the
  global batch);
* **scale** one inside the bound by ``1 / (1 + s)``: a fresh gradient counts in full, one a
  single update old by half, and so on;
* the update is the sample-weighted mean ``g = sum_i w_i n_i g_i / sum_i n_i`` over exactly the
  contributions whose samples sum to ``samples`` (``w_i = 1 / (1 + s_i)``), so with no staleness
  it equals the gradient of one batch of ``samples`` samples (synchronous all-reduce's update).

Contributions are taken in arrival order; one that would overfill the global batch waits for the
next one.  The lead numbers contributions as it adds them, so ids only grow: one whose id is not
above the last one added was added before and raises (O(1) to remember, however long the run),
and ``take`` hands each out exactly once, so no gradient is ever applied twice.

``GlobalBatch(samples=batch, max_staleness=None, decay=False)`` is plain asynchronous
parameter-server training (every gradient applied as it arrives, at full weight).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np


@dataclass
class Contribution:
    """One learner's gradient on one batch: ``grad`` is the mean over its ``n`` samples."""

    id: int  # unique over the run (the lead numbers them)
    learner: int  # learner index (0 = the lead)
    version: int  # updates applied on the weights it was computed on
    n: int  # samples in its batch
    grad: np.ndarray  # float32, flat (every parameter's gradient, in parameters() order)
    arrived: float = 0.0  # monotonic time it reached the lead
    extra: dict = field(default_factory=dict)  # loss, |td|, ... for the caller's logs


@dataclass
class Taken:
    """One global update: the gradient to apply and what went into it."""

    grad: np.ndarray
    used: list[Contribution]
    scales: list[float]  # w_i of each used contribution, in ``used`` order
    staleness: list[int]
    dropped: list[tuple[Contribution, int]]  # (contribution, staleness) dropped on this take


def decay(staleness: int, max_staleness: int | None) -> float:
    """w(s): 1 / (1 + s) for 0 <= s <= max_staleness, 0 beyond (dropped); None: no bound."""
    if staleness < 0:
        raise ValueError(f"staleness={staleness} must be >= 0 (a gradient from the future)")
    if max_staleness is not None and staleness > max_staleness:
        return 0.0
    return 1.0 / (1.0 + staleness)


class GlobalBatch:
    """The token-control aggregator: ``add`` contributions, ``take`` one global update when
    ``ready``.  ``samples``: the global batch (K x batch).  ``decay=False``: every contribution
    inside the bound at full weight."""

    def __init__(self, samples: int, max_staleness: int | None, decay: bool = True) -> None:
        if samples <= 0:
            raise ValueError(f"samples={samples} must be > 0")
        if max_staleness is not None and max_staleness < 0:
            raise ValueError(f"max_staleness={max_staleness} must be >= 0 or None")
        self.samples, self.max_staleness, self.decay = samples, max_staleness, decay
        self.waiting: deque[Contribution] = deque()
        self.last_id = -1  # ids only grow (the lead numbers contributions as it adds them)
        self.applied = 0  # contributions handed out by take()
        self.dropped = 0  # contributions dropped as too stale
        self._drops: list[tuple[Contribution, int]] = []  # dropped since the last take

    def add(self, c: Contribution) -> None:
        if c.id <= self.last_id:
            raise ValueError(
                f"contribution {c.id} (learner {c.learner}) is not above the last id added "
                f"({self.last_id}): it was added before, and a gradient is applied at most once"
            )
        if c.n <= 0 or c.n > self.samples:
            raise ValueError(
                f"contribution {c.id} has n={c.n} samples; it must be in "
                f"1..{self.samples} (the global batch)"
            )
        self.last_id = c.id
        self.waiting.append(c)

    def drain(self) -> list[Contribution]:
        """Every contribution still waiting, which leave (a switch to synchronous updates
        drops them)."""
        out, self.waiting = list(self.waiting), deque()
        return out

    def _prune(self, version: int) -> list[tuple[Contribution, int]]:
        out: list[tuple[Contribution, int]] = []
        if self.max_staleness is None:
            return out
        keep: deque[Contribution] = deque()
        for c in self.waiting:
            s = version - c.version
            (out.append((c, s)) if s > self.max_staleness else keep.append(c))
        self.waiting = keep
        self.dropped += len(out)
        return out

    def _pick(self) -> list[int] | None:
        """Indices into ``waiting`` (arrival order) whose samples sum to exactly ``samples``:
        greedy in arrival order, skipping one that would overfill."""
        got, need = [], self.samples
        for i, c in enumerate(self.waiting):
            if c.n <= need:
                got.append(i)
                need -= c.n
                if need == 0:
                    return got
        return None

    def ready(self, version: int) -> bool:
        """Whether a global batch is assembled at ``version`` (drops what is too stale now)."""
        self._drops += self._prune(version)
        return self._pick() is not None

    def take(self, version: int) -> Taken | None:
        """The global update at ``version``, or None when not ready; its contributions leave."""
        self._drops += self._prune(version)
        pick = self._pick()
        if pick is None:
            return None
        dropped, self._drops = self._drops, []
        used = [self.waiting[i] for i in pick]
        for i in reversed(pick):
            del self.waiting[i]
        stale = [version - c.version for c in used]
        scales = [decay(s, self.max_staleness) if self.decay else 1.0 for s in stale]
        total = np.zeros_like(used[0].grad, dtype=np.float64)
        for c, w in zip(used, scales, strict=True):
            total += (w * c.n) * c.grad.astype(np.float64)
        self.applied += len(used)
        return Taken((total / self.samples).astype(np.float32), used, scales, stale, dropped)


class SwitchRule:
    """When the learner group (``--learner-sync switch``) should train synchronously (all-reduce)
    and when with GBA: from the learners' compute time per batch (not the time waited for the
    others), each learner's median over the batches of the last ``horizon_s`` seconds.

    ``ratio`` = the slowest learner's median / the median of the others' medians.  Switch to GBA
    when it stays above ``up`` (1.5: a synchronous step takes the slowest learner's time, so half
    again as long as the others' is where waiting for it costs more than GBA's staleness) for
    ``persist_s``; back to all-reduce when it stays below ``down`` (1.2) for ``persist_s``; never
    within ``hold_s`` of the last switch (or of the start), and only with ``min_samples`` of
    every learner in the horizon.  Hysteresis in value (1.5 / 1.2), in time (persistence, hold)
    and a median over a time window, not a count: a learner that straggles sends few batches,
    and a window of its last N would keep its fast past for a long time."""

    def __init__(
        self,
        k: int,
        horizon_s: float = 2.0,
        up: float = 1.5,
        down: float = 1.2,
        persist_s: float = 1.0,
        hold_s: float = 2.0,
        min_samples: int = 8,
        now: float = 0.0,
    ) -> None:
        if not 1 < down < up:
            raise ValueError(f"switch thresholds down={down}, up={up}: need 1 < down < up")
        self.k, self.horizon_s, self.up, self.down = k, horizon_s, up, down
        self.persist_s, self.hold_s, self.min_samples = persist_s, hold_s, min_samples
        self.times: list[deque[tuple[float, float]]] = [deque() for _ in range(k)]
        self.t_switch = now  # start-up is no straggler: the first switch waits hold_s too
        self.t_held: float | None = None  # since when the condition for a switch holds

    def observe(self, learner: int, compute_s: float, now: float) -> None:
        q = self.times[learner]
        q.append((now, compute_s))
        while q and q[0][0] < now - self.horizon_s:
            q.popleft()

    def figures(self, now: float) -> tuple[float, int, float, float] | None:
        """(ratio, slowest learner, its median, the others' median) over the horizon, or None
        while a learner has fewer than ``min_samples`` there."""
        recent = [[c for t, c in q if t >= now - self.horizon_s] for q in self.times]
        if any(len(r) < self.min_samples for r in recent):
            return None
        medians = [float(np.median(r)) for r in recent]
        slowest = int(np.argmax(medians))
        others = float(np.median([m for j, m in enumerate(medians) if j != slowest]))
        return medians[slowest] / max(others, 1e-9), slowest, medians[slowest], others

    def decide(self, synchronous: bool, now: float) -> tuple[float, int, float, float] | None:
        """The figures when the group should switch now (from synchronous to GBA, or back),
        else None."""
        f = self.figures(now)
        wanted = f is not None and (f[0] > self.up if synchronous else f[0] < self.down)
        if not wanted:
            self.t_held = None
            return None
        if self.t_held is None:
            self.t_held = now
        if now - self.t_held < self.persist_s or now - self.t_switch < self.hold_s:
            return None
        self.t_switch, self.t_held = now, None
        return f
