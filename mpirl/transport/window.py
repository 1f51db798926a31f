"""How many sampled batches to keep in flight across the long-haul link (pure, no MPI).

The GBA idea applied to the buffer -> learner pipeline: one window switches between synchronous
(``--inflight 1``: fresh priorities, the learner waits a round trip per batch) and asynchronous
operation (``--inflight K``: the round trip is hidden, priority updates arrive late) without
retuning.  ``--inflight auto`` picks the smallest window that keeps the learner busy, by Little's
law: batches in flight = throughput x time in flight, so::

    W = ceil(rtt_net / max(step, tx)) + 1

never below ``floor``: a learner group holds up to ``floor - 1`` batches at once (the lead's
and those it relayed to the other learners, `mpirl.agent.gba.held_at_once`), and a window
smaller than that let a straggler's pipelined orders hold every batch while the lead starved;
``step`` is the learner's time per update, ``tx`` a batch's serialization time on the link
(bytes x 8 / the modelled rate; 0 on a real link): the pipeline moves one batch per
``max(step, tx)``, so on a link-bound path more batches in flight only queue at the sender (and
hold the messages behind them: STATS, DONE, checkpoint acknowledgements), and ``rtt_net`` is a
batch's round trip minus the time it sat at the learner (``hold``) and minus the time it queued
behind earlier batches for the modelled bandwidth (queueing is a symptom of a window that is too
large, so counting it would feed back).  Both are smoothed (EWMA), so when the link changes the
window follows within a few round trips.
"""

from __future__ import annotations

import math


class InflightWindow:
    def __init__(
        self,
        fixed: int | None = None,
        max_window: int = 64,
        smoothing: float = 0.2,
        floor: int = 1,
    ) -> None:
        if fixed is not None and fixed < 1:
            raise ValueError(f"inflight={fixed} must be >= 1 or 'auto'")
        self.fixed, self.max_window, self.smoothing = fixed, max_window, smoothing
        self.floor = max(1, floor)
        self.rtt_net: float | None = None
        self.step: float | None = None
        self.tx = 0.0

    def observe(
        self, rtt_total: float, hold: float, queue_wait: float, step: float, tx: float = 0.0
    ) -> None:
        """One priority update came back: its round trip, the learner's timings and the batch's
        serialization time on the link."""
        net = max(0.0, rtt_total - hold - queue_wait)
        a = self.smoothing
        self.rtt_net = net if self.rtt_net is None else (1 - a) * self.rtt_net + a * net
        if step > 0:
            self.step = step if self.step is None else (1 - a) * self.step + a * step
        self.tx = (1 - a) * self.tx + a * tx if self.tx else tx

    @property
    def size(self) -> int:
        if self.fixed is not None:
            return self.fixed
        if self.rtt_net is None or not self.step:
            return max(2, self.floor)  # before a measurement: one training, one on the way
        per_batch = max(self.step, self.tx)
        return max(self.floor, min(self.max_window, math.ceil(self.rtt_net / per_batch) + 1))
