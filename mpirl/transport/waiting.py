"""How a rank waits without burning the CPU that others need.

Measured with the mpich wheel on 2 cores (one rank computing, 8 waiting on a receive): blocking
``Recv``/``Wait`` made the working rank 4-5x slower; polling ``Test``/``Iprobe`` with a short
sleep brought it back to 1.13x at ~0.2 ms added latency.  So role loops never block in MPI: they
poll, and when a turn did no work they sleep, doubling the nap up to a ceiling (adaptive
back-off), and snap back to the floor as soon as there is work.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol


class Backoff:
    def __init__(self, floor: float = 5e-5, ceiling: float = 2e-3) -> None:
        self.floor, self.ceiling = floor, ceiling
        self.nap = floor
        self.idle_s = 0.0  # total time spent napping (measured, not requested)

    def work(self) -> None:
        """The last turn did something: next idle nap starts short."""
        self.nap = self.floor

    def idle(self, until: float | None = None) -> None:
        """Nothing to do this turn: sleep (never past ``until``, a monotonic deadline)."""
        nap = self.nap
        if until is not None:
            nap = min(nap, max(0.0, until - time.monotonic()))
        t0 = time.monotonic()
        time.sleep(nap)
        self.idle_s += time.monotonic() - t0  # as slept: a short nap overshoots (timer slack)
        self.nap = min(self.ceiling, self.nap * 2)


class Request(Protocol):
    """What `SpinThenNap` needs of a nonblocking MPI request (mpi4py's ``Request``)."""

    def Test(self) -> bool: ...


class SpinThenNap:
    """Complete a nonblocking request that its rank is blocked on anyway (the learner group's
    allreduce): poll ``Test`` without sleeping for up to a spin budget, then poll with naps
    that double from ``nap_floor`` to ``nap_ceiling``.

    MPICH advances a nonblocking collective only inside MPI calls, so a rank that naps between
    polls delays the collective for every rank by up to a nap, each update.  Spinning for the
    expected wait removes that; bounding it keeps the rule of `Backoff`: a rank whose wait is
    long (a straggler in the group, a partner descheduled on an oversubscribed machine) must not
    burn a core that others need.  The budget adapts (as an adaptive mutex's spin does): a wait
    that ended within it doubles it (up to ``spin_cap``), one that ran past it halves it (down
    to ``spin_floor``), so ranks whose waits are short spin them out and ranks whose waits are
    long nap almost at once.  ``spun_s`` / ``napped_s`` add up the seconds of each phase."""

    def __init__(
        self,
        spin_cap: float = 1e-3,
        spin_floor: float = 2e-5,
        nap_floor: float = 2e-5,
        nap_ceiling: float = 5e-4,
        burst: float = 5e-5,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.spin_cap, self.spin_floor = spin_cap, spin_floor
        self.nap_floor, self.nap_ceiling, self.burst = nap_floor, nap_ceiling, burst
        self.clock, self.sleep = clock, sleep
        self.budget = spin_cap
        self.spun_s = self.napped_s = 0.0

    def wait(self, req: Request) -> float:
        """Return once ``req.Test()`` is true; the seconds waited."""
        clock = self.clock
        t0 = clock()
        spin_end = t0 + self.budget
        done = req.Test()
        while not done and clock() < spin_end:
            done = req.Test()
        t1 = clock()
        self.spun_s += t1 - t0
        if done:
            self._adapt(t1 - t0)
            return t1 - t0
        nap = self.nap_floor
        while not done:
            self.sleep(nap)
            nap = min(nap * 2, self.nap_ceiling)
            burst_end = clock() + self.burst
            done = req.Test()
            while not done and clock() < burst_end:
                done = req.Test()
        t2 = clock()
        self.napped_s += t2 - t1
        self._adapt(t2 - t0)
        return t2 - t0

    def _adapt(self, waited: float) -> None:
        """A wait that a spin of ``spin_cap`` would have covered doubles the budget, a longer one
        halves it.  (Judged against the cap, not the budget: waits that run past a small budget
        but are short all the same, as on a quiet machine, bring the spin back.)"""
        if waited <= self.spin_cap:
            self.budget = min(self.spin_cap, self.budget * 2)
        else:
            self.budget = max(self.spin_floor, self.budget / 2)
