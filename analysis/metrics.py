"""Per-run metrics (`run_metrics`), and the two "after convergence" windows they are averaged over.

After convergence (the same rule for both placements, applied to each run on its own)
------------------------------------------------------------------------------------
Let ``loss[i]`` be the loss of update ``i`` (``learner.h5:/updates/loss``, ``n`` rows), ``W`` a
window of updates (default ``clip(n // 10, 10, 500)``) and
``M[j] = mean(loss[j : j + W])`` the moving average. Its final level is ``F = M[n - W]`` (the
mean of the last ``W`` updates).

The loss has *converged* (settled) at update ``j*``: the first ``j`` such that every later
moving average stays within ``tol`` (default 20%) of the final level::

    j* = min { j : |M[j'] - F| <= tol * |F|  for every j' >= j }

This is the settling time of control theory, applied to the loss: it does not care whether the
loss got there by falling (the paper's curve) or, as DQN losses often do, by rising first
(targets grow while the Q-values learn). The window "after convergence" is updates ``j* .. n-1``
and, for quantities logged against time (transfers), every row with ``t >= t(update j*)``.

Fallback: when the settled window is shorter than ``max(W, 10% of n)`` updates, or the run has
fewer than ``2 W`` updates, the loss has not settled within the run (it was still falling or
rising at the end); then the window is the **last 25%** of the updates. `Convergence.method`
says which rule gave the window (``"settled"`` or ``"fallback"``); the tables report it.

Fixed window (the primary one; docs/results/appendix/fixed-updates.md "Plan")
---------------------------------------------------------------------------
With an update budget ``N`` per run (``--max-updates N``; without one, ``N`` is the updates the
run made: its summary's ``updates``, else its last logged update), "after convergence" is the
fixed window of updates ``N/2 .. N``: update numbers ``u`` with ``ceil(N / 2) <= u <= N``, and
for transfers and evaluations every row whose ``update`` column lies in that range. Every run of
a cell then averages over the same updates, whatever its loss curve does. A run that stopped
before ``N`` (target reached, failure) keeps the part of the window it has; ``fixed_complete``
says whether it ran to ``N``. The settle rule above is kept as a sensitivity check: every windowed
mean of `run_metrics` has its fixed-window key (``train_loss``) and its settle-rule key
(``train_loss_conv``).

Why these numbers: a 500-update average of a DQN loss still wanders by several percent, so a band
of ±20% is not broken by noise but is broken by a trend; runs that stop at their return target
while the loss is still falling (CartPole to 475 does) get the fallback, and say so.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import Any

import numpy as np

from analysis.runs import Run

__all__ = [
    "KNOWN_TARGETS",
    "Convergence",
    "Kind",
    "Window",
    "convergence",
    "fixed_window",
    "link_mb_at",
    "moving_average",
    "resolve_target",
    "run_metrics",
    "settle_index",
    "to_target",
    "window_means",
]

TOL = 0.2
MIN_TAIL = 0.1
FALLBACK = 0.25
MAX_WINDOW = 500

# gymnasium reward_threshold of common ids: the learner's default target (config target_return
# None). Unknown ids need --target (or a target_return attr in the learner file).
KNOWN_TARGETS = {
    "CartPole-v0": 195.0,
    "CartPole-v1": 475.0,
    "Acrobot-v1": -100.0,
    "MountainCar-v0": -110.0,
    "LunarLander-v2": 200.0,
    "LunarLander-v3": 200.0,
}


class Kind(IntEnum):
    """``/transfers/kind``: the wire tag of the message that crossed the link (the values of
    ``mpirl.transport.wire.Tag``; analysis does not import mpirl, tests/test_analysis.py
    checks them)."""

    FORWARD = 4  # forwarded experiences (replay_at=learner)
    BATCH = 5  # a sampled batch (replay_at=buffer)


@dataclass(frozen=True)
class Convergence:
    """The after-convergence window of one run: update rows ``start ..`` (0-based)."""

    start: int  # first row of the window in /updates
    update: int  # its update number
    t: float  # its time (s since the learner's loop start)
    method: str  # "settled", "fallback" or "none" (no updates)
    window: int  # W, updates in the moving average
    n: int  # updates in the run


def moving_average(x: np.ndarray, w: int) -> np.ndarray:
    """``M[j] = mean(x[j : j + w])`` for ``j = 0 .. len(x) - w``; non-finite values are left
    out of each mean (NaN where a window has none)."""
    x = np.asarray(x, "f8")
    ok = np.isfinite(x)
    c = np.concatenate([[0.0], np.cumsum(np.where(ok, x, 0.0))])
    k = np.concatenate([[0], np.cumsum(ok)])
    cnt = k[w:] - k[:-w]
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(cnt > 0, (c[w:] - c[:-w]) / np.maximum(cnt, 1), np.nan)


def settle_index(
    loss: np.ndarray,
    window: int | None = None,
    tol: float = TOL,
    min_tail: float = MIN_TAIL,
    fallback: float = FALLBACK,
) -> tuple[int, str, int]:
    """``(start, method, W)`` for a loss series: see the module docstring."""
    loss = np.asarray(loss, "f8")
    n = len(loss)
    if n == 0:
        return 0, "none", 0
    w = int(window) if window else int(np.clip(n // 10, 10, MAX_WINDOW))
    w = max(1, min(w, n))
    fb = min(n - 1, int(np.floor(n * (1 - fallback))))
    if n < 2 * w:
        return fb, "fallback", w
    m = moving_average(loss, w)
    final = m[-1]
    if not np.isfinite(final):
        return fb, "fallback", w
    outside = np.flatnonzero(~(np.abs(m - final) <= tol * abs(final)))  # NaN counts as outside
    start = int(outside[-1]) + 1 if len(outside) else 0
    if n - start < max(w, min_tail * n):
        return fb, "fallback", w
    return start, "settled", w


def fixed_window(update_numbers: np.ndarray, budget: int | None = None) -> tuple[np.ndarray, int]:
    """``(mask, N)``: which of ``update_numbers`` lie in the fixed window ``ceil(N/2) .. N``.

    ``N`` is ``budget`` when it is > 0 (the run's ``--max-updates``), else the largest update
    number (the run's own length); with neither, the mask is all False and ``N`` is 0."""
    u = np.asarray(update_numbers, "i8")
    n = int(budget) if budget else (int(u.max()) if len(u) else 0)
    if n <= 0:
        return np.zeros(len(u), bool), 0
    return (u >= window_start(n)) & (u <= n), n


def window_start(n: int) -> int:
    """First update of the fixed window of a budget of ``n`` updates: ceil(n/2) (0 for none)."""
    return -(-int(n) // 2) if n > 0 else 0


def budget(run: Run) -> int:
    """``N`` of the fixed window: config ``max_updates`` when the run has one, else the updates
    it made (its summary's ``updates``, else its last logged update; 0 without any)."""
    n = run.config.get("max_updates") or run.summary.get("updates") or 0
    if not n:
        upd = run.learner.stream("updates").get("update", np.zeros(0))
        n = int(upd[-1]) if len(upd) else 0
    return int(n)


def convergence(run: Run, **kw: Any) -> Convergence:
    """The after-convergence window of ``run`` (keywords: see `settle_index`)."""
    upd = run.learner.stream("updates")
    loss = upd.get("loss", np.zeros(0))
    start, method, w = settle_index(loss, **kw)
    if method == "none":
        return Convergence(0, 0, float("nan"), "none", 0, 0)
    upd_no = upd.get("update", np.arange(1, len(loss) + 1))
    return Convergence(start, int(upd_no[start]), float(upd["t"][start]), method, w, len(loss))


def resolve_target(run: Run, override: float | None = None) -> tuple[float | None, str]:
    """The return target: ``override``, else the learner's logged ``target_return`` (summary or
    file attr), else the config's ``target_return``, else the env's known reward threshold."""
    if override is not None:
        return float(override), "--target"
    for src, v in (
        ("summary", run.summary.get("target_return")),
        ("learner.h5 attrs", run.learner.attrs.get("target_return")),
        ("config", run.config.get("target_return")),
    ):
        try:
            if v is not None and np.isfinite(float(v)):
                return float(v), src
        except (TypeError, ValueError):  # e.g. "none": no target in the run; use the env's
            pass
    env = run.config.get("env")
    if env in KNOWN_TARGETS:
        return KNOWN_TARGETS[env], f"{env} reward threshold"
    return None, "unknown (pass --target)"


def _nanmean(x: np.ndarray) -> float:
    x = np.asarray(x, "f8")
    x = x[np.isfinite(x)]
    return float(np.mean(x)) if len(x) else float("nan")


def _weighted_mean(x: np.ndarray, w: np.ndarray) -> float:
    x, w = np.asarray(x, "f8"), np.asarray(w, "f8")
    ok = np.isfinite(x) & (w > 0)
    return float(np.sum(x[ok] * w[ok]) / np.sum(w[ok])) if ok.any() else float("nan")


def _nanmedian(x: np.ndarray) -> float:
    return float(np.nanmedian(x)) if np.isfinite(x).any() else float("nan")


def link_mb_at(run: Run, t: np.ndarray) -> np.ndarray:
    """Cumulative link MB (both directions, learner side: ``/link`` ``bytes_in + bytes_out``)
    at times ``t`` (learner loop clock): each ``/link`` row closes an interval at its ``t``, so
    the bytes are known at those times and linearly interpolated in between (0 at the loop
    start)."""
    link = run.learner.stream("link")
    t = np.asarray(t, "f8")
    if not len(link.get("t", ())):
        return np.full(t.shape, np.nan)
    order = np.argsort(link["t"], kind="stable")
    lt = np.asarray(link["t"], "f8")[order]
    b = (np.asarray(link["bytes_in"], "f8") + np.asarray(link["bytes_out"], "f8"))[order]
    return np.interp(t, np.concatenate([[0.0], lt]), np.concatenate([[0.0], np.cumsum(b)])) / 1e6


@dataclass(frozen=True)
class Window:
    """The rows a windowed mean covers: ``/updates`` rows with ``update >= first`` (and
    ``<= last`` when given), ``/evals`` rows of those updates, and ``/transfers`` rows of those
    updates or, with ``since_t``, every transfer at or after that time."""

    first: int
    last: int | None = None
    since_t: float | None = None

    def mask(self, stream: dict[str, np.ndarray], by_time: bool = False) -> np.ndarray:
        if by_time:
            return np.asarray(stream.get("t", np.zeros(0)), "f8") >= self.since_t
        u = np.asarray(stream.get("update", np.zeros(0)), "i8")
        return (u >= self.first) & (u <= self.last if self.last is not None else True)


def window_means(run: Run, w: Window) -> dict[str, float]:
    """The means over one window, defined the same way in both placements:

    - ``ref_loss``: mean ``/evals/reference_loss`` of the window's evaluations (NaN: no set);
      ``return_window``: their mean ``ret_mean``.
    - ``train_loss``, ``batch_td``: mean ``/updates/loss`` (importance weighted) and
      ``/updates/td_abs_mean``.
    - ``prio_held``: mean of ``/transfers/priority_mean`` weighted by ``n`` (the priority the
      sender held, per transition); ``prio_msg_median`` / ``prio_msg_p90``: the median over the
      window's messages of each message's ``priority_median`` / ``priority_p90``.
    - ``prio_per_mb``: priority delivered per MB over the link = sum(n * priority_mean) /
      sum(nbytes) * 1e6, the window's messages toward the learner (their size on the link).
    - ``arrival_prio``, ``arrival_td``: ``/transfers/arrival_*_mean`` (under the learner's
      network on arrival) weighted by ``arrival_n`` (the subsample they are over; ``n`` in logs
      without it); ``transferred``: the window's transitions (sum of ``n``).
    """
    upd, xf, ev = (run.learner.stream(s) for s in ("updates", "transfers", "evals"))
    in_u, in_e = w.mask(upd), w.mask(ev)
    in_x = w.mask(xf, by_time=w.since_t is not None)

    def col(s: dict[str, np.ndarray], k: str, mask: np.ndarray) -> np.ndarray:
        return np.asarray(s.get(k, np.full(len(mask), np.nan)), "f8")[mask]

    n, nbytes, pm = (col(xf, k, in_x) for k in ("n", "nbytes", "priority_mean"))
    ok = np.isfinite(pm) & (n > 0)
    per_mb = (
        float(np.sum(n[ok] * pm[ok]) / np.sum(nbytes[ok]) * 1e6)
        if ok.any() and np.sum(nbytes[ok]) > 0
        else float("nan")
    )
    an = col(xf, "arrival_n", in_x) if "arrival_n" in xf else n
    return {
        "ref_loss": _nanmean(col(ev, "reference_loss", in_e)),
        "train_loss": _nanmean(col(upd, "loss", in_u)),
        "batch_td": _nanmean(col(upd, "td_abs_mean", in_u)),
        "prio_held": _weighted_mean(pm, n),
        "prio_msg_median": _nanmedian(col(xf, "priority_median", in_x)),
        "prio_msg_p90": _nanmedian(col(xf, "priority_p90", in_x)),
        "prio_per_mb": per_mb,
        "arrival_prio": _weighted_mean(col(xf, "arrival_priority_mean", in_x), an),
        "arrival_td": _weighted_mean(col(xf, "arrival_td_mean", in_x), an),
        "return_window": _nanmean(col(ev, "ret_mean", in_e)),
        "transferred": int(np.sum(n[np.isfinite(n)])),
    }


def to_target(run: Run, target: float | None, recorded: bool = True) -> dict[str, Any]:
    """Time to target, the one rule: the first ``/evals`` row with ``ret_mean >= target``; its
    ``t`` (learner loop clock), ``env_steps``, ``update`` and the cumulative link MB at that
    time (`link_mb_at`). When the learner stopped at that target itself (``recorded``: the run's
    own target, no override) it wrote the same evaluation into its summary
    (``time_to_target_s``, ``env_steps_to_target``, ``updates_to_target``) on the run's training
    clock, which also counts the earlier segments of a resumed run: those are taken. None = not
    reached (censored by the caller, `analysis.stats.time_to_target`) or no target."""
    keys = ("time_to_target_s", "env_steps_to_target", "updates_to_target", "link_mb_to_target")
    out: dict[str, Any] = dict.fromkeys(keys)
    ev, s = run.learner.stream("evals"), run.summary
    rets = np.asarray(ev.get("ret_mean", np.zeros(0)), "f8")
    hit = np.flatnonzero(rets >= target) if target is not None else []
    if len(hit):
        i = hit[0]
        out.update(
            time_to_target_s=float(ev["t"][i]),
            env_steps_to_target=int(ev["env_steps"][i]),
            updates_to_target=int(ev["update"][i]),
        )
    if recorded and s.get("time_to_target_s") is not None:
        steps, ups = s.get("env_steps_to_target"), s.get("updates_to_target")
        out.update(
            time_to_target_s=float(s["time_to_target_s"]),
            env_steps_to_target=int(steps) if steps is not None else None,
            updates_to_target=int(ups) if ups is not None else out["updates_to_target"],
        )
    if out["time_to_target_s"] is not None:
        out["link_mb_to_target"] = float(link_mb_at(run, np.array([out["time_to_target_s"]]))[0])
    return out


def delivered_fraction(run: Run) -> float:
    """Forwarded transitions that reached the learner over the env steps the actors produced
    (replay_at=learner only, else NaN): the summary's ``delivered_fraction`` when the learner
    wrote it, else ``/transfers/n`` of kind `Kind.FORWARD` over the whole run / summary
    ``env_steps`` (each env step yields one n-step transition)."""
    s = run.summary
    if run.replay_at != "learner":
        return float("nan")
    if s.get("delivered_fraction") is not None:
        return float(s["delivered_fraction"])
    xf = run.learner.stream("transfers")
    n = np.asarray(xf.get("n", np.zeros(0)), "f8")
    fwd = np.asarray(xf["kind"], "i8") == Kind.FORWARD if "kind" in xf else np.ones(len(n), bool)
    steps = s.get("env_steps")
    return float(np.sum(n[fwd]) / steps) if steps else float("nan")


def _link_totals(run: Run) -> dict[str, Any]:
    """The summary's link bytes (learner side: ``in`` = toward the learner), their total, per
    update and in MB."""
    s = run.summary
    b_in, b_out = s.get("link_bytes_in"), s.get("link_bytes_out")
    tot = (b_in or 0) + (b_out or 0) if b_in is not None or b_out is not None else None
    updates = int(s.get("updates") or 0) or len(run.learner.stream("updates").get("loss", ()))
    return {
        "link_bytes_in": b_in,
        "link_bytes_out": b_out,
        "link_bytes_total": tot,
        "link_bytes_per_update": tot / updates if tot is not None and updates else None,
        "link_mb": tot / 1e6 if tot is not None else float("nan"),
    }


def run_metrics(
    run: Run, target: float | None = None, window: int | None = None, tol: float = TOL
) -> dict[str, Any]:
    """One flat dict of every per-run metric (NaN/None when unavailable):

    - the run: ``run``, ``replay_at``, ``seed``, ``summary_source``, ``stop_reason``,
      ``updates``, ``env_steps``, ``wall_s``, ``delivered_fraction`` (`delivered_fraction`);
    - the fixed window (`budget`, `fixed_window`): ``window_start_update``, ``budget_updates``
      (N), ``fixed_complete`` (the run reached N), and every mean of `window_means` over it
      (``train_loss``, ``prio_held``, ...); ``return_per_mb`` = ``return_window`` / ``link_mb``;
    - the settle rule (`convergence`, ``window`` = W and ``tol`` as there): ``conv_method``,
      ``conv_start_row``, ``conv_update``, ``conv_t``, ``conv_window``, ``loss_final_w`` (mean
      loss of the last W updates), and every mean of `window_means` with ``_conv`` appended,
      transfers counted by time (``t >= conv_t``);
    - link bytes (`_link_totals`); the target (`resolve_target`) and time to it (`to_target`);
      ``final_eval`` / ``best_eval``: the last and best ``/evals/ret_mean``.
    """
    s = run.summary
    upd = run.learner.stream("updates")
    loss = np.asarray(upd.get("loss", np.zeros(0)), "f8")
    n_fixed = budget(run)
    fixed = window_means(run, Window(window_start(n_fixed), n_fixed if n_fixed else None))
    conv = convergence(run, window=window, tol=tol)
    if conv.method == "none":
        settled = dict.fromkeys(fixed, float("nan")) | {"transferred": 0}
    else:
        settled = window_means(run, Window(conv.update, since_t=conv.t))
    link = _link_totals(run)
    tgt, tgt_src = resolve_target(run, target)
    rets = np.asarray(run.learner.stream("evals").get("ret_mean", np.zeros(0)), "f8")
    updates = int(s.get("updates") or 0) or len(loss)
    return {
        "run": str(run.path),
        "replay_at": run.replay_at,
        "seed": run.seed,
        "summary_source": run.summary_source,
        "stop_reason": s.get("stop_reason"),
        "updates": updates,
        "env_steps": s.get("env_steps"),
        "wall_s": s.get("wall_s"),
        "delivered_fraction": delivered_fraction(run),
        "window_start_update": window_start(n_fixed),
        "budget_updates": n_fixed,
        "fixed_complete": bool(n_fixed) and updates >= n_fixed,
        **fixed,
        "return_per_mb": fixed["return_window"] / link["link_mb"]
        if link["link_mb"] and np.isfinite(link["link_mb"])
        else float("nan"),
        "conv_method": conv.method,
        "conv_start_row": conv.start,
        "conv_update": conv.update,
        "conv_t": conv.t,
        "conv_window": conv.window,
        "loss_final_w": _nanmean(loss[-conv.window :]) if conv.window else float("nan"),
        **{f"{k}_conv": v for k, v in settled.items()},
        **link,
        "target": tgt,
        "target_source": tgt_src,
        **to_target(run, tgt, recorded=target is None),
        "final_eval": float(rets[-1]) if len(rets) else None,
        "best_eval": float(np.max(rets)) if len(rets) else None,
    }
