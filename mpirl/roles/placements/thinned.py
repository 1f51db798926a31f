"""``--replay-at thinned`` (prioritized thinning, issue 47): the prioritized replay memory at the
learner, as with ``--replay-at learner``, but the edge buffer forwards each experience only with
a probability ``f_i`` that grows with its initial priority, and says so; the learner weighs
what it samples by it, so that nothing is lost from the estimate, only bytes from the link
(docs/design.md, "A third placement: prioritized thinning").

The rule (`Thinner`), per experience, with ``q_i = (|td_i| + eps) ** alpha`` the actor's initial
priority as PER stores it:

    f_i = clip(q_i / tau, FLOOR * b, 1)

(rounded to the byte FORWARD carries it in, `wire.keep_code`), where the budget
``b = min(1, RHO_SHARE * rho, link share)`` is the fraction to forward and ``tau`` is solved
(`solve_threshold`) so that the mean of ``f`` over the last `WINDOW` priorities is ``b``.
``b = 1`` forwards everything: the placement is then ``--replay-at learner`` exactly (no ``keep``
array on the wire).  The rho-budget ships about what the learner will sample (rho per produced
transition, when the run sets rho: ``--replay-ratio``, or ``--learner-updates-per-s`` with
``--actor-steps-per-s``); the link-budget keeps the forwarded bytes within `LINK_SHARE` of an
emulated link's rate, from the production rate and the bytes of the last FORWARD (a real link,
whose rate this direction does not measure: 1).

`SiteThinning` is the buffer's side (`at_learner.SiteForwarding`, with the rule at ``add``);
`ThinnedMemory` the learner's (`at_learner.LocalMemory`, with ``f_i`` kept per slot).  The
learner's importance weights become

    w_i = (N P(i) f_i) ** -beta / (N P_min f_min) ** -beta = (p_i f_i / (p_min f_min)) ** -beta

(``p_min``, ``f_min``: the smallest over the memory), so at ``beta = 1`` the weighted mean over
the learner's samples estimates the mean over every *produced* transition (Horvitz-Thompson),
not over the forwarded ones only; and never above 1.  Its rate limiter counts every produced
transition (FORWARD's ``produced``), so rho stays samples per produced transition.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from mpirl.agent.frames import compact
from mpirl.errors import ConfigError
from mpirl.replay.build import make_replay
from mpirl.roles.placements.at_learner import LocalMemory, SiteForwarding
from mpirl.transport.wire import keep_code, keep_value

if TYPE_CHECKING:
    from collections.abc import Callable

    from mpirl.agent.envs import EnvSpec
    from mpirl.roles.placements.common import Drawn, LearnerContext, SiteContext
    from mpirl.run.config import Config
    from mpirl.transport.link import LinkEnd
    from mpirl.transport.wire import Experience, Forward, Wire

#: c: the rho-budget forwards this many transitions per sample the learner draws (1: each
#: forwarded transition is sampled about once; docs/design.md's pilot: below the buffer
#: placement's bytes at rho 0.25 only for c up to ~1.4)
RHO_SHARE = 1.0
#: the share of a budget every transition gets whatever its priority: ``f_i >= FLOOR * b``, which
#: bounds the importance weights' spread (the variance of the estimate) by ``1 / (FLOOR * b)``
FLOOR = 0.1
#: the link-budget's share of an emulated link's rate (the rest: STATS, DONE, CHECKPOINT); the
#: advisor counts a placement that keeps this much of its demand as not capped
#: (`advise.CAPPED_BELOW`)
LINK_SHARE = 0.95
#: recent priorities the threshold is solved over
WINDOW = 4096
#: transitions received between two solves of the threshold (also solved when the budget moves
#: by more than `RESOLVE` of itself)
SOLVE_EVERY = 1024
RESOLVE = 0.05
#: seconds over which the production rate is averaged (exponentially), and the shortest interval
#: measured
RATE_S = 1.0
RATE_MIN_DT = 0.05


def replay_ratio_of(cfg: Config, actors: int) -> float | None:
    """rho, samples per produced transition, where the run sets it: ``--replay-ratio``, else
    ``--learner-updates-per-s`` x batch / (``--actor-steps-per-s`` x actors); None otherwise."""
    if cfg.replay_ratio > 0:
        return float(cfg.replay_ratio)
    if cfg.learner_updates_per_s > 0 and cfg.actor_steps_per_s > 0 and actors > 0:
        return cfg.learner_updates_per_s * cfg.batch_size / (cfg.actor_steps_per_s * actors)
    return None


def solve_threshold(q: np.ndarray, b: float) -> float:
    """The ``tau`` with ``mean(clip(q / tau, FLOOR * b, 1)) = b`` (0 < b < 1), by bisection on
    ``log tau``: the mean falls from 1 (tau <= min q) to ``FLOOR * b`` (from max q / (FLOOR b))."""
    lo, hi = math.log(float(q.min())), math.log(float(q.max()) / (FLOOR * b))
    floor = FLOOR * b
    for _ in range(40):
        mid = 0.5 * (lo + hi)
        if np.clip(q / math.exp(mid), floor, 1.0).mean() > b:
            lo = mid
        else:
            hi = mid
    return math.exp(0.5 * (lo + hi))


class Thinner:
    """The thinning rule (module docstring): pure, no MPI and no clock of its own."""

    def __init__(self, alpha: float, eps: float, rho: float | None, seed: int) -> None:
        self.alpha, self.eps = alpha, eps
        self.rho_budget = 1.0 if rho is None else min(1.0, RHO_SHARE * rho)
        self.link_budget = 1.0
        self.window = np.zeros(WINDOW, np.float64)  # recent priorities, a ring
        self.filled = self.cursor = 0
        self.tau = 0.0  # the threshold, solved for budget ``tau_budget``
        self.tau_budget = 1.0
        self.since = 0  # priorities seen since the last solve
        self.seed = seed
        self.rng = np.random.default_rng(seed)

    @property
    def budget(self) -> float:
        """The expected fraction forwarded: ``min(1, rho-budget, link-budget)``."""
        return min(1.0, self.rho_budget, self.link_budget)

    def remember(self, q: np.ndarray) -> None:
        q = q[-WINDOW:]
        end = self.cursor + len(q)
        first = min(len(q), WINDOW - self.cursor)
        self.window[self.cursor : self.cursor + first] = q[:first]
        self.window[: len(q) - first] = q[first:]
        self.cursor = end % WINDOW
        self.filled = min(WINDOW, self.filled + len(q))
        self.since += len(q)

    def probabilities(self, td_abs: np.ndarray) -> np.ndarray:
        """``f`` of a message's transitions (float32; all 1 when the budget is 1), each rounded
        to what its byte on the wire stands for (`wire.keep_code`)."""
        q = (np.abs(np.asarray(td_abs, np.float64)) + self.eps) ** self.alpha
        self.remember(q)
        b = self.budget
        if b >= 1.0:
            return np.ones(len(q), np.float32)
        if self.tau == 0.0 or self.since >= SOLVE_EVERY or abs(b - self.tau_budget) > RESOLVE * b:
            self.tau = solve_threshold(self.window[: self.filled], b)
            self.tau_budget, self.since = b, 0
        return keep_value(keep_code(np.clip(q / self.tau, FLOOR * b, 1.0)))

    def choose(self, td_abs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(f, kept): each transition's probability and whether it is forwarded."""
        f = self.probabilities(td_abs)
        return f, self.rng.random(len(f)) < f

    def set_link(self, link_Bps: float, produced_per_s: float, bytes_per_forwarded: float) -> None:
        """The link-budget: `LINK_SHARE` of the link's bytes/s over what forwarding every
        produced transition would take (1 when the rate or a figure is unknown)."""
        if math.isfinite(link_Bps) and produced_per_s > 0 and bytes_per_forwarded > 0:
            self.link_budget = LINK_SHARE * link_Bps / (produced_per_s * bytes_per_forwarded)
        else:
            self.link_budget = 1.0

    def state(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        meta = {
            "thin_link_budget": self.link_budget,
            "thin_tau": self.tau,
            "thin_tau_budget": self.tau_budget,
            "thin_since": self.since,
            "thin_filled": self.filled,
            "thin_cursor": self.cursor,
        }
        return meta, {"thin_window": self.window}

    def restore(self, meta: dict[str, Any], arrays: dict[str, np.ndarray], draws: int) -> None:
        """The rule's state; the random stream restarts from (seed, ``draws``)."""
        self.link_budget, self.tau = meta["thin_link_budget"], meta["thin_tau"]
        self.tau_budget, self.since = meta["thin_tau_budget"], meta["thin_since"]
        self.filled, self.cursor = meta["thin_filled"], meta["thin_cursor"]
        self.window[:] = np.asarray(arrays["thin_window"][:], np.float64)
        self.rng = np.random.default_rng([self.seed, int(draws)])


class SiteThinning(SiteForwarding):
    """The buffer forwards each experience with its probability ``f_i`` (`Thinner`); what it
    keeps goes as `at_learner.SiteForwarding` sends it, with ``f`` and the produced count."""

    def __init__(
        self,
        cfg: Config,
        spec: EnvSpec,
        wire: Wire,
        link: LinkEnd,
        on_raw: Callable[..., None],
        thinner: Thinner,
    ) -> None:
        super().__init__(cfg, spec, wire, link, on_raw)
        self.thinner = thinner
        self.thinned = 0  # transitions not forwarded (the rule's draw)
        self.pending = 0  # thinned out or dropped since the last FORWARD: the next stands for them
        self.arrived = 0  # transitions received since the rate was last measured
        self.t_rate: float | None = None
        self.rate = 0.0  # produced transitions per second (this site)
        self.fwd_bytes = 0.0  # bytes per transition of the last FORWARD

    def add(self, m: Experience) -> None:
        f, kept = self.thinner.choose(m.td_abs)
        k = int(np.count_nonzero(kept))
        self.inserted += m.n
        self.arrived += m.n
        self.thinned += m.n - k
        self.pending += m.n - k
        dropped = self.queue.dropped
        if k == m.n:
            self.queue.add(m.records, m.td_abs, m.frames, None if f.min() >= 1.0 else f)
        elif k:
            records, frames = m.records[kept], m.frames
            if frames is not None:  # only the frames the kept ones refer to
                records, frames = compact(records, frames)
            self.queue.add(records, m.td_abs[kept], frames, f[kept])
        self.pending += self.queue.dropped - dropped

    def site_row(self) -> dict[str, float]:
        return {**super().site_row(), "thinned": self.thinned, "thin_budget": self.thinner.budget}

    def ship(self, now: float, stopping: bool) -> bool:
        self.measure(now)
        return super().ship(now, stopping)

    def measure(self, now: float) -> None:
        """The production rate (averaged over `RATE_S`) and with it the link-budget."""
        if self.t_rate is None:
            self.t_rate, self.arrived = now, 0
            return
        dt = now - self.t_rate
        if dt < RATE_MIN_DT:
            return
        seen = self.arrived / dt
        self.rate = (
            seen
            if self.rate == 0
            else self.rate + (1 - math.exp(-dt / RATE_S)) * (seen - self.rate)
        )
        self.t_rate, self.arrived = now, 0
        self.thinner.set_link(self.link.profile.rate_bps / 8, self.rate, self.fwd_bytes)

    def next_message(self) -> tuple[np.ndarray, int]:
        records, td, table, keep = self.queue.take_kept(self.cfg.forward_chunk)
        n = len(records)
        produced = n + self.pending if self.pending else 0  # (0: the message's own n)
        out = self.wire.forward(
            records, td, self.fwd_seq, frames=table, keep=keep, produced=produced
        )
        self.pending = 0
        self.fwd_bytes = out.nbytes / n
        return out, n

    def save(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        meta, arrays = super().save()
        rule, window = self.thinner.state()
        own = {
            "thinned": self.thinned,
            "thin_pending": self.pending,
            "thin_rate": self.rate,
            "thin_fwd_bytes": self.fwd_bytes,
        }
        return {**meta, **rule, **own}, {**arrays, **window}

    def restore(self, meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
        super().restore(meta, arrays)
        self.thinned, self.pending = meta["thinned"], meta["thin_pending"]
        self.rate, self.fwd_bytes = meta["thin_rate"], meta["thin_fwd_bytes"]
        self.thinner.restore(meta, arrays, self.inserted)


class ThinnedMemory(LocalMemory):
    """`at_learner.LocalMemory` that keeps each slot's ``f`` and weighs its samples by it
    (module docstring); its rate limiter counts produced transitions, ``delivered`` the ones
    that arrived."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.keep = np.ones(self.memory.capacity, np.float32)  # f per slot
        #: the smallest f over the slots written (an image memory's retired ones included: a
        #: smaller normaliser, so weights stay at most 1)
        self.keep_min = 1.0
        self.received = 0  # transitions that arrived (the limiter counts the produced ones)

    def held(self) -> int:
        """Slots written so far (the ring fills from slot 0)."""
        return min(self.memory.inserted, self.memory.capacity)

    def insert(self, m: Forward) -> None:
        slots = self.memory.add(m.records, m.td_abs, m.frames)
        keep = m.keep
        self.keep[slots] = 1.0 if keep is None else keep[len(keep) - len(slots) :]
        self.keep_min = float(self.keep[: self.held()].min())
        self.received += m.n

    def draw(self, beta: float) -> Drawn | None:
        """PER's batch, each weight times ``(f_i / f_min) ** -beta``."""
        drawn = super().draw(beta)
        if drawn is None or drawn.indices is None or drawn.weights is None or self.keep_min >= 1:
            return drawn
        f = self.keep[drawn.indices]
        drawn.weights = drawn.weights * (f / np.float32(self.keep_min)) ** np.float32(-beta)
        if drawn.drawn_as is not None:  # a slot stands for 1 / f produced transitions
            drawn.drawn_as = drawn.drawn_as * f
        return drawn

    def delivered(self) -> int | None:
        return self.received

    def save(self) -> tuple[dict[str, Any], dict[str, np.ndarray] | None]:
        meta, arrays = super().save()
        # a view of the held slots (written before the memory changes, as the ring is)
        return {**meta, "received": self.received}, {
            **(arrays or {}),
            "thin_keep": self.keep[: self.held()],
        }

    def restore(self, meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
        super().restore(meta, arrays)
        n = self.held()
        keep = np.asarray(arrays["thin_keep"][:], np.float32)
        if keep.shape != (n,):
            raise ValueError(f"thin_keep of {keep.shape} in the checkpoint, {n} slots held")
        self.keep[:n], self.keep[n:] = keep, 1.0
        self.keep_min = float(keep.min()) if n else 1.0
        self.received = meta["received"]


# ---- what the wiring builds (mpirl.roles.placements) ---------------------------------------------
def site_side(ctx: SiteContext) -> SiteThinning:
    cfg = ctx.cfg
    thinner = Thinner(cfg.alpha, cfg.priority_eps, replay_ratio_of(cfg, ctx.actors), ctx.seed)
    return SiteThinning(cfg, ctx.spec, ctx.wire, ctx.link, ctx.on_raw, thinner)


def batch_source(ctx: LearnerContext) -> ThinnedMemory:
    cfg = ctx.cfg
    if ctx.group.k != 1:
        raise ConfigError("--replay-at thinned needs --learners 1")
    memory = make_replay(cfg, ctx.spec, ctx.wire.record, seed=ctx.seed)
    return ThinnedMemory(
        cfg,
        memory,
        ctx.sites,
        ctx.wire,
        ctx.streams["transfers"],
        ctx.arrivals,
        ctx.updates,
        ctx.group.route,
        cfg.learning_starts,
    )


def worker_shard(cfg: Config, spec: Any, record: Any, k: int, index: int, seed: int) -> None:
    """No shards: a group learner's memory would not know the f of its slots."""
    raise ConfigError("--replay-at thinned needs --learners 1")


def edge_memory_bytes(cfg: Config, spec: Any) -> int:
    return 0  # a forward queue of a few chunks, as --replay-at learner
