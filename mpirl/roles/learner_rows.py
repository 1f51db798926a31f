"""The learner's per-update log rows and their statistics (no MPI, no torch).

`HeldRows` holds the /updates row of every update and the /transfers row of every trained batch
(with the replay memory at the buffer) and appends them in blocks, with each block's statistics
(means, the linear median and p90 of a batch's priorities, the arrival means) computed over a
(rows, batch) array: one row at a time they cost ~30 us per update, each small numpy call running
just after a train step has evicted the caches (docs/design.md, "The learner's per-update rows,
written in blocks").  `small_mean` and `spread` are the one-row forms (the learner's FORWARD rows
use them).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from mpirl.logs.runlog import RunLog
from mpirl.transport.wire import Tag


def small_mean(x: np.ndarray) -> float:
    """Mean of a small array for a log row: np.mean's dispatch costs ~4x the sum of 64 values,
    and the learner logs four means per update (docs/benchmarks.md, "Component overheads")."""
    return float(np.add.reduce(x, axis=None)) / x.size if x.size else float("nan")


def td_units(p: np.ndarray, alpha: float) -> np.ndarray:
    """Priorities p = (|td|+eps)^alpha back in PER's unit |td|+eps (NaN when alpha is 0: the
    exponent erased |td|)."""
    if alpha <= 0:
        return np.full(p.shape, np.nan, np.float32)
    return p ** np.float32(1.0 / alpha)


def huber(td_abs: np.ndarray, delta: float) -> np.ndarray:
    """Huber loss of |td| (what dqn_loss computes per sample before weighting)."""
    return np.where(td_abs <= delta, 0.5 * td_abs * td_abs, delta * (td_abs - 0.5 * delta))


def spread(p: np.ndarray) -> dict:
    """Median and p90 of one message's priorities (/transfers), as np.percentile's default
    (linear) method gives them, from one sort: ~1 us for a batch of 64 where np.percentile
    costs ~30 us, once per update with the replay memory at the buffer."""
    if not p.size:
        return {"priority_median": np.nan, "priority_p90": np.nan}
    s = np.sort(p, axis=None)
    out = []
    for q in (0.5, 0.9):
        h = (s.size - 1) * q
        lo = int(h)
        hi = min(lo + 1, s.size - 1)
        out.append(float(s[lo]) + (h - lo) * (float(s[hi]) - float(s[lo])))
    return {"priority_median": out[0], "priority_p90": out[1]}


class HeldRows:
    """The learner's /updates and /transfers rows, held back and appended in blocks.

    Each batch's |td| and priorities are copied into a (rows, batch) block; the rows go to the
    streams at ``BLOCK`` of them or at the log's next flush (`RunLog.before_flush`), so the file
    on disk has every row it had when they were appended one by one; each keeps the time it was
    made."""

    BLOCK = 256

    def __init__(
        self, logs: dict, log: RunLog, alpha: float, eps: float, huber_delta: float = 1.0
    ) -> None:
        self.updates_stream, self.transfers_stream = logs["updates"], logs["transfers"]
        self.t0, self.alpha, self.eps, self.delta = log.t0, alpha, eps, huber_delta
        self.u: list[tuple] = []  # (t, update, loss, beta)
        self.b: list[tuple] = []  # (t, buffer, update, n, nbytes, raw_nbytes, window)
        self.u_td = _Rows()  # |td| of each update's batch
        self.u_p = _Rows()  # what each sample was drawn in proportion to (NaN: not known)
        self.b_pr = _Rows()  # each trained batch's priorities at its buffer
        self.b_td = _Rows()  # |td| of its arrival subsample (none: --arrival-sample 0)
        log.before_flush(self.flush)

    def update(
        self,
        update: int,
        loss: float,
        td: np.ndarray,
        beta: float,
        drawn_as: np.ndarray | None = None,
    ) -> None:
        """An update's row; ``drawn_as``: what its batch was drawn in proportion to (None: not
        known, td_abs_uniform NaN)."""
        if not self.u_td.fits(td):
            self.flush()
        self.u.append((time.monotonic() - self.t0, update, loss, beta))
        self.u_td.add(td)
        self.u_p.add(np.full(td.shape, np.nan, np.float32) if drawn_as is None else drawn_as)
        if len(self.u) >= self.BLOCK:
            self.flush()

    def batch(
        self,
        buffer: int,
        update: int,
        n: int,
        nbytes: int,
        raw_nbytes: int,
        window: int,
        priorities: np.ndarray,
        td: np.ndarray | None,
    ) -> None:
        td = np.zeros(0, np.float32) if td is None else td
        if not (self.b_pr.fits(priorities) and self.b_td.fits(td)):
            self.flush()
        self.b.append((time.monotonic() - self.t0, buffer, update, n, nbytes, raw_nbytes, window))
        self.b_pr.add(priorities)
        self.b_td.add(td)
        if len(self.b) >= self.BLOCK:
            self.flush()

    def flush(self) -> None:
        if self.u:
            t, update, loss, beta = zip(*self.u, strict=True)
            self.u = []
            td, p = self.u_td.take(), self.u_p.take()
            self.updates_stream.extend(
                t=t,
                update=update,
                loss=loss,
                beta=beta,
                loss_unweighted=_row_means(huber(td, self.delta)),
                td_abs_mean=_row_means(td),
                td_abs_uniform=uniform_means(td, p),
            )
        if self.b:
            t, buffer, update, n, nbytes, raw, window = zip(*self.b, strict=True)
            self.b = []
            pr, td = self.b_pr.take(), self.b_td.take()
            k = len(t)
            if pr.shape[1]:
                med, p90 = np.percentile(pr, [50, 90], axis=1)
            else:
                med = p90 = np.full(k, np.nan)
            self.transfers_stream.extend(
                t=t,
                buffer=buffer,
                update=update,
                kind=np.full(k, int(Tag.BATCH)),
                n=n,
                nbytes=nbytes,
                raw_nbytes=raw,
                priority_mean=_row_means(pr),
                priority_td_mean=_row_means(td_units(pr, self.alpha)),
                priority_median=med,
                priority_p90=p90,
                arrival_td_mean=_row_means(td),
                arrival_priority_mean=_row_means((td + self.eps) ** self.alpha),
                arrival_n=np.full(k, td.shape[1]),
                window=window,
            )


class _Rows:
    """Equal-length 1-D arrays copied into the rows of one growing 2-D block."""

    def __init__(self) -> None:
        self.a: np.ndarray | None = None
        self.k = 0

    def fits(self, x: np.ndarray) -> bool:
        return self.a is None or self.k == 0 or x.shape[0] == self.a.shape[1]

    def add(self, x: np.ndarray) -> None:
        """Append ``x`` (the caller empties the block with `take` first unless it `fits`)."""
        if self.a is None or x.shape[0] != self.a.shape[1]:
            if self.k:
                assert self.a is not None  # rows are held in it
                raise ValueError(
                    f"a row of {x.shape[0]} values in a block of "
                    f"{self.a.shape[1]}-value rows; take() the block first"
                )
            self.a = np.empty((HeldRows.BLOCK, x.shape[0]), np.float32)
        elif self.k == len(self.a):
            self.a = np.concatenate([self.a, np.empty_like(self.a)])
        self.a[self.k] = x
        self.k += 1

    def take(self) -> np.ndarray:
        out = self.a[: self.k].copy() if self.a is not None else np.zeros((0, 0), np.float32)
        self.k = 0
        return out


def uniform_means(td: np.ndarray, drawn_as: np.ndarray) -> np.ndarray:
    """Each row's self-normalized importance-sampling estimate of the mean |td| over the
    population its batch was drawn from, sample i weighted by ``1 / drawn_as_i``: the |td| a
    uniform draw would have met (NaN where ``drawn_as`` is not known or not positive)."""
    if not td.shape[1]:
        return np.full(len(td), np.nan)
    with np.errstate(divide="ignore", invalid="ignore"):
        inv = np.where(drawn_as > 0, 1.0 / drawn_as.astype(np.float64), np.nan)
        return (td * inv).sum(axis=1) / inv.sum(axis=1)


def _row_means(a: np.ndarray) -> np.ndarray:
    """Mean of each row; NaN for rows of no values."""
    if not a.shape[1]:
        return np.full(len(a), np.nan)
    return a.mean(axis=1, dtype=np.float64)


class Arrivals:
    """The arrival |td| statistic: a uniform random subsample of min(n, ``sample``) of each
    message's transitions (``--arrival-sample``, in both placements), and its /transfers
    fields.  ``td_of(records, frames)`` is |td| under the current networks."""

    def __init__(
        self,
        sample: int,
        alpha: float,
        eps: float,
        rng: np.random.Generator,
        td_of: Callable[..., np.ndarray],
    ) -> None:
        self.sample, self.alpha, self.eps, self.rng, self.td_of = sample, alpha, eps, rng, td_of

    def pick(self, n: int) -> np.ndarray | None:
        """Which of a message's n transitions enter the statistic (None: --arrival-sample 0)."""
        k = min(n, self.sample)
        if k == 0:
            return None
        return np.arange(n) if k == n else np.sort(self.rng.choice(n, k, replace=False))

    def td(self, records: np.ndarray, frames: np.ndarray | None = None) -> np.ndarray | None:
        """|td| of a forwarded message's subsample: one forward pass over at most
        --arrival-sample transitions, whatever the chunk size."""
        pick = self.pick(len(records))
        return None if pick is None else self.td_of(records[pick], frames)

    def of_batch(self, td: np.ndarray) -> np.ndarray | None:
        """The subsample of a trained batch's own |td| (no extra forward pass)."""
        pick = self.pick(len(td))
        return None if pick is None else td if len(pick) == len(td) else td[pick]

    def stats(self, td: np.ndarray | None) -> dict[str, float]:
        if td is None:
            return {"arrival_td_mean": np.nan, "arrival_priority_mean": np.nan, "arrival_n": 0}
        return {
            "arrival_td_mean": small_mean(td),
            "arrival_priority_mean": small_mean((td + self.eps) ** self.alpha),
            "arrival_n": td.size,
        }
