"""How a rank waits without burning the CPU that others need.

Measured with the mpich wheel on 2 cores (one rank computing, 8 waiting on a receive): blocking
``Recv``/``Wait`` made the working rank 4-5x slower; polling ``Test``/``Iprobe`` with a short
sleep brought it back to 1.13x at ~0.2 ms added latency.  So role loops never block in MPI: they
poll, and when a turn did no work they sleep, doubling the nap up to a ceiling (adaptive
back-off), and snap back to the floor as soon as there is work.
"""

from __future__ import annotations

import time


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
