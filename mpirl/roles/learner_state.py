"""The learner's counters and clocks, in one object (`LearnerState`): the learner and the parts
it is handed read and advance them; a checkpoint holds the counters."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np


@dataclass
class LearnerState:
    """The learner's counters and clocks, in one place (a checkpoint holds the counters)."""

    beta: float
    t_start: float = field(default_factory=time.monotonic)
    updates: int = 0
    weights_version: int = -1
    elapsed_before: float = 0.0  # wall time of earlier launches (resumed runs)
    stop_reason: str | None = None
    stop_sent: bool = False
    final_ckpt: int = -1
    busy: float = 0.0  # seconds spent on updates
    loss_sum: float = 0.0  # over the progress interval
    loss_n: int = 0
    capped_s: float = 0.0  # time a batch was staged but the --learner-updates-per-s cap held it
    t_turn: float | None = None  # start of the last turn the cap held an update
    #: (updates, flat weights) of the last broadcast
    broadcast: tuple[int, np.ndarray | None] = (-1, None)
    to_target: dict[str, float] = field(default_factory=dict)

    def wall_total(self) -> float:
        return self.elapsed_before + time.monotonic() - self.t_start
