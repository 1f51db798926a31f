"""Pacing: a token bucket that holds a rank to a requested rate (``--actor-steps-per-s``,
``--learner-updates-per-s``; docs/design.md, "Pacing").

Tokens accrue at ``rate`` per second up to ``burst``; an actor takes one per env step (all its
envs' steps of a turn at once), the learner one per update.  A rank that finds too few tokens
does not spin: it sleeps until ``ready_at()`` (at most its poll interval, so messages are still
served).  Lateness does not accumulate: tokens keep accruing while a rank is late, so the long-run
rate is ``rate`` whenever the rank can keep up, and whatever it can do otherwise (achieved rates
are logged: learner.h5:/progress).
"""

from __future__ import annotations

import time
from collections.abc import Callable


class TokenBucket:
    def __init__(
        self,
        rate: float,
        take: int = 1,
        burst_s: float = 0.1,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``rate`` tokens per second (> 0); ``take`` tokens per `try_take` (the bucket holds at
        least that many); ``burst_s``: seconds of tokens a rank that fell behind may catch up."""
        if not rate > 0:
            raise ValueError(f"rate={rate!r} must be > 0")
        self.rate, self.take = float(rate), int(take)
        self.burst = max(float(take), self.rate * burst_s)
        self.clock = clock
        self.tokens = float(take)  # start with one turn's worth: no burst at start-up
        self.t = clock()
        self.waited_s = 0.0  # total time napped in `wait` (pacing, not work)

    def _refill(self, now: float) -> None:
        self.tokens = min(self.burst, self.tokens + (now - self.t) * self.rate)
        self.t = now

    def try_take(self, now: float | None = None) -> bool:
        """Take ``take`` tokens if they are there."""
        self._refill(self.clock() if now is None else now)
        if self.tokens >= self.take:
            self.tokens -= self.take
            return True
        return False

    def ready_at(self) -> float:
        """The clock time at which ``take`` tokens will be there (<= now when they are)."""
        return self.t + max(0.0, self.take - self.tokens) / self.rate

    def wait(self, max_s: float) -> None:
        """Sleep until tokens are there, at most ``max_s`` (never spins)."""
        nap = min(max_s, max(0.0, self.ready_at() - self.clock()))
        if nap > 0:
            time.sleep(nap)
            self.waited_s += nap
