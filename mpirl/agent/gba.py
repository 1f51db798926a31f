"""Global-batch gradient aggregation (GBA, Su et al. 2022) for the learner group: pure, no MPI.

The lead learner acts as GBA's parameter server (docs/design.md, "Learner group", sets the
paper's mechanism and this one side by side).  Token control:

* `Tokens`: the server's token supply.  A token is the global step (update count) its
  gradient is meant for; there are K per step (the global batch, K x batch, is K batches), and
  tokens of the current step ``v`` and the next, ``v + 1``, are handed out on demand with the
  work: a learner that asks first takes one, so a fast learner takes the tokens a slow one has
  not claimed and computes more gradients; a learner may hold ``depth`` tokens at once
  (pipelining: it computes its next gradient while its last one travels), a second one only
  while a token is left for every learner holding none.  With K learners at equal speed every
  learner takes one token of each step, and every gradient's token equals the step it is
  applied at: staleness 0.  Its weights may still be older (a pipelined order for step v + 1 is
  computed on the weights of step v): the lead logs that as ``lag``, and in learning runs it was
  1.6 updates on average (docs/design.md), so token staleness 0 is not synchronous training.
* staleness ``s = max(0, step_now - token)`` (read from the token: steps applied since the
  step its gradient was meant for); a contribution without a token (``async``) uses the version
  of the weights it was computed on;
* **drop** a contribution with ``s > max_staleness`` (its samples do not count toward the
  global batch);
* **decay only severe staleness**: full weight for ``s <= severe``, ``1 / (1 + s - severe)``
  beyond (`decay`); ``severe = 0`` is the plain ``1 / (1 + s)`` of every stale gradient;
* the update is the sample-weighted mean ``g = sum_i w_i n_i g_i / sum_i n_i`` over exactly the
  contributions whose samples sum to ``samples`` (K x batch), the oldest tokens first, so with
  no staleness it equals the gradient of one batch of ``samples`` samples (synchronous
  all-reduce's update).  Contributions whose token is ahead of the step wait for the next
  update, unless the token supply of this step and the next is spent (then waiting would stall
  every learner on the slowest one: ``ahead=True``).

The lead numbers contributions as it adds them, so ids only grow: one whose id is not above the
last one added was added before and raises (O(1) to remember, however long the run), and
``take`` hands each out exactly once, so no gradient is ever applied twice.

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
    token: int | None = None  # the step it is meant for (None: ``version``, no token control)

    @property
    def step(self) -> int:
        """The global step it is meant for: its token, else the version it was computed on."""
        return self.version if self.token is None else self.token

    def staleness(self, now: int) -> int:
        """Steps applied since the step it was meant for (0 when it is early)."""
        return max(0, now - self.step)


@dataclass
class Taken:
    """One global update: the gradient to apply and what went into it."""

    grad: np.ndarray
    used: list[Contribution]
    scales: list[float]  # w_i of each used contribution, in ``used`` order
    staleness: list[int]
    dropped: list[tuple[Contribution, int]]  # (contribution, staleness) dropped on this take


def decay(staleness: int, max_staleness: int | None, severe: int = 0) -> float:
    """w(s): 1 for s <= ``severe`` (mild staleness is not decayed), 1 / (1 + s - severe) for
    severe < s <= max_staleness, 0 beyond (dropped); ``max_staleness`` None: no bound.
    ``severe = 0``: 1 / (1 + s) for every stale gradient."""
    if staleness < 0:
        raise ValueError(f"staleness={staleness} must be >= 0 (a gradient from the future)")
    if severe < 0:
        raise ValueError(f"severe={severe} must be >= 0")
    if max_staleness is not None and staleness > max_staleness:
        return 0.0
    return 1.0 / (1.0 + max(0, staleness - severe))


#: orders another learner holds at once under async / gba (pipelining: the next is there when
#: it finishes one); the lead computes its own one at a time
PIPELINE = 2


def held_at_once(learners: int, sync: str) -> int:
    """Batches a learner group trains on at once: the lead's one, and one per other learner
    under all-reduce or up to `PIPELINE` under async / gba / switch."""
    return 1 + (learners - 1) * (1 if sync == "allreduce" else PIPELINE)


class Tokens:
    """GBA's token supply (the module's docstring): K tokens per global step, handed out on
    demand in order.  The next token is for step ``step + pending // K``, ``pending`` being the
    tokens out (held) and the gradients in but not applied yet: at equal speed the K tokens of
    a step go out one to each learner as they finish, and each comes back at its step; a
    gradient dropped as too stale frees its place (the supply does not drift ahead).  Learner
    ``j`` holds at most ``depth[j]`` at once (pipelining: its next batch is there when it
    finishes one) and takes a token while it is at most `AHEAD` steps after the current step:
    a fast learner goes on while a slower one computes and takes the tokens the slower one has
    not claimed (its share of a step), so it ingests more."""

    AHEAD = 2

    def __init__(self, k: int, depth: list[int]) -> None:
        if k <= 0 or len(depth) != k or min(depth) < 1:
            raise ValueError(f"k={k}, depth={depth}: need k > 0 and k depths >= 1")
        self.k, self.depth = k, depth
        self.held = [0] * k  # tokens each learner holds (its gradient not back yet)

    def reset(self) -> None:
        """Nothing held (a switch to GBA, after the orders out came back)."""
        self.held = [0] * self.k

    def next(self, step: int, waiting: int) -> int:
        """The next token (its step), with ``waiting`` gradients in but not applied."""
        return step + (sum(self.held) + waiting) // self.k

    def can_claim(self, learner: int, step: int, waiting: int) -> bool:
        """Whether ``learner`` may take a token now (the class docstring)."""
        if self.held[learner] >= self.depth[learner]:
            return False
        return self.next(step, waiting) <= step + self.AHEAD

    def blocked(self, step: int, waiting: int) -> bool:
        """A learner waits for a token it may not take until an update is made (it holds
        fewer than its depth, the next token is more than `AHEAD` steps on): waiting for this
        step's last gradients would tie it to the slowest (the server then fills the global
        batch with gradients meant for later steps).  While every learner is busy at its depth
        nobody waits, and the step waits for its own gradients (staleness 0)."""
        if self.next(step, waiting) <= step + self.AHEAD:
            return False
        return any(h < d for h, d in zip(self.held, self.depth, strict=True))

    def claim(self, learner: int, step: int, waiting: int) -> int | None:
        """A token for ``learner`` (the step its gradient is meant for), or None."""
        if not self.can_claim(learner, step, waiting):
            return None
        u = self.next(step, waiting)
        self.held[learner] += 1
        return u

    def returned(self, learner: int) -> None:
        """``learner``'s gradient for its oldest token came back (or its order was dropped)."""
        if self.held[learner] <= 0:
            raise ValueError(f"learner {learner} returned a token it does not hold")
        self.held[learner] -= 1


class GlobalBatch:
    """The token-control aggregator: ``add`` contributions, ``take`` one global update when
    ``ready``.  ``samples``: the global batch (K x batch).  ``decay=False``: every contribution
    inside the bound at full weight."""

    def __init__(
        self, samples: int, max_staleness: int | None, decay: bool = True, severe: int = 0
    ) -> None:
        if samples <= 0:
            raise ValueError(f"samples={samples} must be > 0")
        if max_staleness is not None and max_staleness < 0:
            raise ValueError(f"max_staleness={max_staleness} must be >= 0 or None")
        if severe < 0:
            raise ValueError(f"severe={severe} must be >= 0")
        self.samples, self.max_staleness, self.decay = samples, max_staleness, decay
        self.severe = severe
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
            s = c.staleness(version)
            (out.append((c, s)) if s > self.max_staleness else keep.append(c))
        self.waiting = keep
        self.dropped += len(out)
        return out

    def _pick(self, version: int, ahead: bool) -> list[int] | None:
        """Indices into ``waiting`` whose samples sum to exactly ``samples``: greedy, the oldest
        token first (arrival order among equal ones), skipping one that would overfill; one
        whose token is after ``version`` only when ``ahead``."""
        got, need = [], self.samples
        order = sorted(range(len(self.waiting)), key=lambda i: self.waiting[i].step)
        for i in order:
            c = self.waiting[i]
            if c.n <= need and (ahead or c.step <= version):
                got.append(i)
                need -= c.n
                if need == 0:
                    return got
        return None

    def ready(self, version: int, ahead: bool = True) -> bool:
        """Whether a global batch is assembled at ``version`` (drops what is too stale now)."""
        self._drops += self._prune(version)
        return self._pick(version, ahead) is not None

    def take(self, version: int, ahead: bool = True) -> Taken | None:
        """The global update at ``version``, or None when not ready; its contributions leave.
        ``ahead``: contributions whose token is after ``version`` may fill it."""
        self._drops += self._prune(version)
        pick = self._pick(version, ahead)
        if pick is None:
            return None
        dropped, self._drops = self._drops, []
        used = [self.waiting[i] for i in pick]
        for i in sorted(pick, reverse=True):
            del self.waiting[i]
        stale = [c.staleness(version) for c in used]
        scales = [decay(s, self.max_staleness, self.severe) if self.decay else 1.0 for s in stale]
        total = np.zeros_like(used[0].grad, dtype=np.float64)
        for c, w in zip(used, scales, strict=True):
            total += (w * c.n) * c.grad.astype(np.float64)
        self.applied += len(used)
        return Taken((total / self.samples).astype(np.float32), used, scales, stale, dropped)


class SwitchRule:
    """When the learner group (``--learner-sync switch``) should train synchronously (all-reduce)
    and when with GBA: from the learners' compute time per batch (not the time waited for the
    others), each learner's median over the batches of the last ``horizon_s`` seconds.

    Each learner's median is first divided by its own **baseline**, the smallest of its medians so
    far (its best pace: each median over the last ``horizon_s``, taken whenever every learner has
    ``min_samples`` there, so the first may span less than a full horizon), so that a learner
    steadily slower for a reason of its own (the lead, which also relays batches and serves the
    group, measured 1.5-2.3x the other learner's compute at load 4 with no straggler, and flapped
    the group into GBA and out every few seconds) is not a straggler; one that becomes slower than
    it was is.  A baseline is capped at ``own_pace`` (2) x the fastest learner's, so a learner more
    than twice as slow from the start (a slow node) still counts as a straggler; up to twice as slow
    from the start (the lead's 1.5-2.3x at load 4) is taken as its own pace.
    ``ratio`` = the slowest learner's normalised median / the median of the others'.
    Switch to GBA
    when it stays above ``up`` (1.5: a synchronous step takes the slowest learner's time, so half
    again as long as the others' is where waiting for it costs more than GBA's staleness) for
    ``persist_s``; back to all-reduce when it stays below ``down`` (1.2) for ``persist_s``; never
    within ``hold_s`` of the last switch (or of the start), and only with ``min_samples`` of
    every learner in the horizon.  Hysteresis in value (1.5 / 1.2), in time (persistence, hold)
    and a median over a time window, not a count: a learner that straggles sends few batches,
    and a window of its last N would keep its fast past for a long time."""

    CHECK_S = 0.05  # `decide` looks at the figures at most this often

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
        own_pace: float = 2.0,
    ) -> None:
        if not 1 < down < up:
            raise ValueError(f"switch thresholds down={down}, up={up}: need 1 < down < up")
        self.k, self.horizon_s, self.up, self.down = k, horizon_s, up, down
        self.persist_s, self.hold_s, self.min_samples = persist_s, hold_s, min_samples
        self.times: list[deque[tuple[float, float]]] = [deque() for _ in range(k)]
        self.t_switch = now  # start-up is no straggler: the first switch waits hold_s too
        self.t_held: float | None = None  # since when the condition for a switch holds
        self.best = [np.inf] * k  # each learner's smallest median so far (its baseline)
        self.t_checked = -np.inf  # when `decide` last looked at the figures
        self.own_pace = own_pace

    def observe(self, learner: int, compute_s: float, now: float) -> None:
        q = self.times[learner]
        q.append((now, compute_s))
        while q and q[0][0] < now - self.horizon_s:
            q.popleft()

    def figures(self, now: float) -> tuple[float, int, float, float] | None:
        """(ratio, slowest learner, its median, the others' median) over the horizon (the ratio
        of medians each divided by the learner's baseline), or None while a learner has fewer
        than ``min_samples`` there."""
        recent = [[c for t, c in q if t >= now - self.horizon_s] for q in self.times]
        if any(len(r) < self.min_samples for r in recent):
            return None
        medians = [float(np.median(r)) for r in recent]
        self.best = [min(b, m) for b, m in zip(self.best, medians, strict=True)]
        # a learner's own pace is its baseline only up to `own_pace` x the fastest one's: a
        # learner slower than that from the start (a slow node) is a straggler, not its norm
        cap = self.own_pace * min(self.best)
        paced = [m / max(min(b, cap), 1e-12) for m, b in zip(medians, self.best, strict=True)]
        slowest = int(np.argmax(paced))
        others = [j for j in range(self.k) if j != slowest]
        ratio = paced[slowest] / max(float(np.median([paced[j] for j in others])), 1e-9)
        return ratio, slowest, medians[slowest], float(np.median([medians[j] for j in others]))

    def decide(self, synchronous: bool, now: float) -> tuple[float, int, float, float] | None:
        """The figures when the group should switch now (from synchronous to GBA, or back),
        else None.  Looks at most every ``CHECK_S``: the medians over a 2 s horizon take
        ~160 us, and the lead asks every turn (hundreds a second), while a switch needs the
        condition held for ``persist_s`` anyway."""
        if now - self.t_checked < self.CHECK_S:
            return None
        self.t_checked = now
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
