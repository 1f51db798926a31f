"""``--tensorboard``: the learner's and the buffers' log rows mirrored into TensorBoard event
files, live.

Each of those ranks writes its own events (one writer per folder, no MPI traffic): its `RunLog`
hands every stream's rows to `TensorBoardMirror` as it flushes them to HDF5 (every
``--flush-seconds``), so the dashboard costs nothing per update or per batch and shows what the
HDF5 files hold.  Tags, steps and downsampling are those of ``python -m analysis.to_tensorboard``
(the same `analysis.to_tensorboard.Scalars` and `BufferScalars`):

- the learner, into ``RUN_DIR/tensorboard``: progress, greedy evaluations, the loss (mean of each
  100 updates), link rates, priorities and the in-flight window per site;
- buffer ``s``, into ``RUN_DIR/tensorboard/buffer-<s>`` (a run of its own in TensorBoard, so the
  sites share one chart per tag): its ``/site`` counters (replay size, inserted, sampled,
  priority updates, round trip, window, ...), its side of the link, and its sampled batches
  (priority, max weight, beta; mean of each 100 batches).

Actors write none (their rows are per episode; ``analysis`` reads them).  A resumed run adds a
file in each folder and its steps continue.  View with ``tensorboard --logdir RUN_DIR``.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from analysis.to_tensorboard import SCALARS, TENSORBOARD_EXTRA, EventWriter

FLUSH_SECONDS = 5.0  # the event file reaches the disk at least this often


def check_installed() -> None:
    """ConfigError when --tensorboard cannot write (checked at the learner and the buffers,
    mpirl.resources)."""
    if importlib.util.find_spec("tensorboard") is None:
        from mpirl.config import ConfigError

        raise ConfigError(f"tensorboard=True needs the tensorboard package: {TENSORBOARD_EXTRA}")


class TensorBoardMirror:
    """A `RunLog` mirror: ``write(stream, columns)`` for each flushed block, ``close()``;
    ``role``: whose rows they are (learner or buffer)."""

    def __init__(self, logdir: str | Path, log, role: str = "learner"):
        self.scalars = SCALARS[role][0](float(log.file.attrs["t0_unix"]))
        self.writer = EventWriter(logdir, flush_secs=FLUSH_SECONDS)

    def write(self, stream: str, cols: dict) -> None:
        self.writer.add(self.scalars.rows(stream, cols))

    def close(self) -> None:
        self.writer.add(self.scalars.finish())
        self.writer.close()
