"""Per-run metrics, and the "after convergence" window they are averaged over.

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

Fixed window (the primary one, issue 14; docs/results/appendix/fixed-updates.md "Plan")
---------------------------------------------------------------
With an update budget ``N`` per run (``--max-updates N``; without one, ``N`` is the updates the
run made), "after convergence" is the fixed window of updates ``N/2 .. N``: update numbers
``u`` with ``ceil(N / 2) <= u <= N``, and for transfers every row whose ``update`` column lies in
that range. Every run of a cell then averages over the same updates, whatever its loss curve
does. A run that stopped before ``N`` (target reached, failure) keeps the part of the window it
has; ``fixed_complete`` says whether it ran to ``N``. The settle rule above is kept as a
sensitivity check (the ``*_conv`` keys beside the ``*_fixed`` ones).

Why these numbers: a 500-update average of a DQN loss still wanders by several percent, so a band
of ±20% is not broken by noise but is broken by a trend; runs that stop at their return target
while the loss is still falling (CartPole to 475 does) get the fallback, and say so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from analysis.runs import Run

__all__ = ["KNOWN_TARGETS", "Convergence", "convergence", "fixed_window", "moving_average",
           "resolve_target", "run_metrics", "settle_index"]

TOL = 0.2
MIN_TAIL = 0.1
FALLBACK = 0.25
MAX_WINDOW = 500

# gymnasium reward_threshold of common ids: the learner's default target (config target_return
# None). Unknown ids need --target (or a target_return attr in the learner file).
KNOWN_TARGETS = {
    "CartPole-v0": 195.0, "CartPole-v1": 475.0, "Acrobot-v1": -100.0, "MountainCar-v0": -110.0,
    "LunarLander-v2": 200.0, "LunarLander-v3": 200.0,
}


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
    loss: np.ndarray, window: int | None = None, tol: float = TOL, min_tail: float = MIN_TAIL,
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
    for src, v in (("summary", run.summary.get("target_return")),
                   ("learner.h5 attrs", run.learner.attrs.get("target_return")),
                   ("config", run.config.get("target_return"))):
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


def run_metrics(run: Run, target: float | None = None, **conv_kw: Any) -> dict[str, Any]:
    """One flat dict of everything the tables need, for one run (NaN/None when unavailable).

    - ``loss_fixed``, ``prio_held_fixed``, ``prio_arrival_fixed``, ``td_arrival_fixed``: the same
      means over the fixed window of updates ``N/2 .. N`` (`fixed_window`; ``budget_updates`` is
      ``N``, ``fixed_complete`` whether the run reached it): the primary window.
    - ``loss_conv``: mean loss over the after-convergence updates (settle rule: the sensitivity
      check).
    - ``prio_held_conv``: transfers with ``t >= conv_t``, mean of ``priority_mean`` weighted by
      ``n`` (the priority the sender held); ``prio_arrival_conv`` the same for
      ``arrival_priority_mean``, ``td_arrival_conv`` for ``arrival_td_mean`` (under the
      learner's network on arrival), weighted by ``arrival_n`` (the subsample they are over;
      ``n`` in logs older than --arrival-sample).
    - ``link_bytes_*``: summary (learner side: ``in`` = toward the learner); per update =
      (in + out) / updates.
    - ``time_to_target_s`` / ``env_steps_to_target``: the summary's when it has them and no
      override target is given, else the first ``evals`` row with ``ret_mean >= target``
      (its ``t`` and ``env_steps``); None = not reached.
    """
    s = run.summary
    conv = convergence(run, **conv_kw)
    upd = run.learner.stream("updates")
    loss = np.asarray(upd.get("loss", np.zeros(0)), "f8")
    xf = run.learner.stream("transfers")
    after = np.asarray(xf.get("t", np.zeros(0))) >= conv.t if conv.method != "none" else None
    if after is None or not len(xf.get("n", ())):
        held = arrival = td = float("nan")
        n_after = 0
    else:
        w = xf["n"][after]
        held = _weighted_mean(xf["priority_mean"][after], w)
        wa = xf["arrival_n"][after] if "arrival_n" in xf else w  # the subsample's size
        arrival = _weighted_mean(xf["arrival_priority_mean"][after], wa)
        td = _weighted_mean(xf["arrival_td_mean"][after], wa)
        n_after = int(np.sum(w))
    updates = int(s.get("updates") or 0) or len(loss)
    budget = int(run.config.get("max_updates") or 0)
    in_fixed, n_fixed = fixed_window(upd.get("update", np.arange(1, len(loss) + 1)), budget)
    xf_fixed = (fixed_window(xf.get("update", np.zeros(0, "i8")), n_fixed)[0] if n_fixed
                else np.zeros(len(xf.get("n", ())), bool))
    if xf_fixed.any():
        w = xf["n"][xf_fixed]
        fixed = {k: _weighted_mean(xf[col][xf_fixed], w) for k, col in (
            ("prio_held_fixed", "priority_mean"), ("prio_arrival_fixed", "arrival_priority_mean"),
            ("td_arrival_fixed", "arrival_td_mean"))}
    else:
        fixed = dict.fromkeys(("prio_held_fixed", "prio_arrival_fixed", "td_arrival_fixed"),
                              float("nan"))
    b_in = s.get("link_bytes_in")
    b_out = s.get("link_bytes_out")
    b_tot = (b_in or 0) + (b_out or 0) if b_in is not None or b_out is not None else None

    tgt, tgt_src = resolve_target(run, target)
    ev = run.learner.stream("evals")
    rets = np.asarray(ev.get("ret_mean", np.zeros(0)), "f8")
    tt = steps = None
    if target is None and s.get("time_to_target_s") is not None:
        tt, steps, tt_src = float(s["time_to_target_s"]), s.get("env_steps_to_target"), "summary"
    else:
        tt_src = "evals"
        if tgt is not None and len(rets):
            hit = np.flatnonzero(rets >= tgt)
            if len(hit):
                tt, steps = float(ev["t"][hit[0]]), int(ev["env_steps"][hit[0]])
    return {
        "run": str(run.path),
        "replay_at": run.replay_at,
        "seed": run.seed,
        "summary_source": run.summary_source,
        "stop_reason": s.get("stop_reason"),
        "updates": updates,
        "env_steps": s.get("env_steps"),
        "wall_s": s.get("wall_s"),
        "conv_method": conv.method,
        "conv_start_row": conv.start,
        "conv_update": conv.update,
        "conv_t": conv.t,
        "conv_window": conv.window,
        "budget_updates": n_fixed,
        "fixed_complete": bool(n_fixed) and updates >= n_fixed,
        "loss_fixed": _nanmean(loss[in_fixed]),
        **fixed,
        "loss_conv": _nanmean(loss[conv.start:]),
        "loss_final_w": _nanmean(loss[-conv.window:]) if conv.window else float("nan"),
        "prio_held_conv": held,
        "prio_arrival_conv": arrival,
        "td_arrival_conv": td,
        "transferred_conv": n_after,
        "link_bytes_in": b_in,
        "link_bytes_out": b_out,
        "link_bytes_total": b_tot,
        "link_bytes_per_update": b_tot / updates if b_tot is not None and updates else None,
        "target": tgt,
        "target_source": tgt_src,
        "time_to_target_s": tt,
        "env_steps_to_target": int(steps) if steps is not None else None,
        "to_target_source": tt_src,
        "final_eval": float(rets[-1]) if len(rets) else None,
        "best_eval": float(np.max(rets)) if len(rets) else None,
    }


# --- the paper experiment's metrics (issue 14, item 3): the same definition in both placements ---

def budget_window_start(run: Run) -> int:
    """First update of the fixed window "after convergence" = updates N/2 .. N, with N the run's
    update budget (config ``max_updates`` when the run has one, else the updates it made)."""
    n = run.config.get("max_updates") or run.summary.get("updates") or 0
    if not n:
        upd = run.learner.stream("updates").get("update", np.zeros(0))
        n = int(upd[-1]) if len(upd) else 0
    return window_start(int(n))  # the same window as `fixed_window`


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


def paper_metrics(run: Run, target: float | None = None) -> dict[str, Any]:
    """The per-run metrics of the fixed-update Plan (docs/results/appendix/fixed-updates.md),
    each defined the same way in both
    placements. Window: updates N/2 .. N (`budget_window_start`); rows of ``/transfers`` and
    ``/evals`` count by their ``update``.

    - ``ref_loss``: mean ``/evals/reference_loss`` of the window's evaluations (NaN: no set).
    - ``train_loss``, ``batch_td``: mean ``/updates/loss`` (importance weighted) and
      ``/updates/td_abs_mean`` over the window.
    - ``prio_held``: mean of ``/transfers/priority_mean`` weighted by ``n`` (per transition);
      ``prio_msg_median`` / ``prio_msg_p90``: the median over the window's messages of each
      message's ``priority_median`` / ``priority_p90``.
    - ``prio_per_mb``: priority delivered per MB over the link = sum(n * priority_mean) /
      sum(nbytes) * 1e6, the window's messages toward the learner (their size on the link).
    - ``arrival_prio``, ``arrival_td``: ``/transfers/arrival_*_mean`` weighted by ``arrival_n``.
    - ``return_window``: mean ``/evals/ret_mean`` over the window; ``return_per_mb`` that over
      the run's link MB (both directions, summary ``link_bytes_in + link_bytes_out``).
    - ``delivered_fraction`` (existing placement only, else NaN): forwarded transitions that
      reached the learner (``/transfers/n`` of kind 4, the whole run) over the env steps the
      actors produced (summary ``env_steps``); each env step yields one n-step transition.
    - ``time_to_target_s``, ``updates_to_target``, ``link_mb_to_target``: at the first
      evaluation with ``ret_mean >= target`` (its ``t``, ``update``, cumulative link MB at
      ``t``); None = not reached (censored by the caller, `analysis.stats.time_to_target`).
    """
    start = budget_window_start(run)
    upd = run.learner.stream("updates")
    u_no = np.asarray(upd.get("update", np.zeros(0)), "i8")
    in_u = u_no >= start
    xf = run.learner.stream("transfers")
    in_x = np.asarray(xf.get("update", np.zeros(0)), "i8") >= start
    ev = run.learner.stream("evals")
    e_upd = np.asarray(ev.get("update", np.zeros(0)), "i8")
    in_e = e_upd >= start

    def col(s, k, mask):
        return np.asarray(s.get(k, np.full(len(mask), np.nan)), "f8")[mask]

    n = col(xf, "n", in_x)
    nbytes = col(xf, "nbytes", in_x)
    pm = col(xf, "priority_mean", in_x)
    ok = np.isfinite(pm) & (n > 0)
    per_mb = float(np.sum(n[ok] * pm[ok]) / np.sum(nbytes[ok]) * 1e6) \
        if ok.any() and np.sum(nbytes[ok]) > 0 else float("nan")
    an = col(xf, "arrival_n", in_x) if "arrival_n" in xf else n

    s = run.summary
    b_in, b_out = s.get("link_bytes_in"), s.get("link_bytes_out")
    link_mb = ((b_in or 0) + (b_out or 0)) / 1e6 if b_in is not None or b_out is not None \
        else float("nan")
    ret_w = _nanmean(col(ev, "ret_mean", in_e))
    tgt, _ = resolve_target(run, target)
    rets = np.asarray(ev.get("ret_mean", np.zeros(0)), "f8")
    tt = ut = mbt = None
    if tgt is not None:
        hit = np.flatnonzero(rets >= tgt)
        if len(hit):
            t_hit = float(ev["t"][hit[0]])
            tt, ut = t_hit, int(e_upd[hit[0]])
            mbt = float(link_mb_at(run, np.array([t_hit]))[0])
    steps = s.get("env_steps")
    n_all = np.asarray(xf.get("n", np.zeros(0)), "f8")
    fwd = np.asarray(xf["kind"], "i8") == 4 if "kind" in xf else np.ones(len(n_all), bool)
    if run.replay_at != "learner":
        delivered = float("nan")
    elif s.get("delivered_fraction") is not None:  # the learner's own figure (summary.json)
        delivered = float(s["delivered_fraction"])
    else:  # runs from before it was logged: forwarded transitions per env step
        delivered = float(np.sum(n_all[fwd]) / steps) if steps else float("nan")
    return {
        "run": str(run.path), "replay_at": run.replay_at, "seed": run.seed,
        "window_start_update": start,
        "delivered_fraction": delivered,
        "ref_loss": _nanmean(col(ev, "reference_loss", in_e)),
        "train_loss": _nanmean(col(upd, "loss", in_u)),
        "batch_td": _nanmean(col(upd, "td_abs_mean", in_u)),
        "prio_held": _weighted_mean(pm, n),
        "prio_msg_median": float(np.nanmedian(col(xf, "priority_median", in_x)))
        if np.isfinite(col(xf, "priority_median", in_x)).any() else float("nan"),
        "prio_msg_p90": float(np.nanmedian(col(xf, "priority_p90", in_x)))
        if np.isfinite(col(xf, "priority_p90", in_x)).any() else float("nan"),
        "prio_per_mb": per_mb,
        "arrival_prio": _weighted_mean(col(xf, "arrival_priority_mean", in_x), an),
        "arrival_td": _weighted_mean(col(xf, "arrival_td_mean", in_x), an),
        "link_mb": link_mb,
        "return_window": ret_w,
        "return_per_mb": ret_w / link_mb if link_mb and np.isfinite(link_mb) else float("nan"),
        "target": tgt,
        "wall_s": s.get("wall_s"),
        "updates": s.get("updates"),
        "time_to_target_s": tt,
        "updates_to_target": ut,
        "link_mb_to_target": mbt,
    }
