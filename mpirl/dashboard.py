"""``--tensorboard``: the learner's log rows mirrored into TensorBoard event files, live.

The learner rank only (one writer, no MPI traffic): its `RunLog` hands every stream's rows to
`TensorBoardMirror` as it flushes them to HDF5 (every ``--flush-seconds``), so the dashboard
costs nothing per update and shows what ``learner.h5`` holds.  Tags, steps and downsampling are
those of ``python -m analysis.to_tensorboard`` (the same `analysis.to_tensorboard.Scalars`):
progress, greedy evaluations, the loss (mean of each 100 updates), link rates, priorities and
the in-flight window per site.  Files go to ``RUN_DIR/tensorboard``; a resumed run adds a file
there and its steps continue.  View with ``tensorboard --logdir RUN_DIR``.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from analysis.to_tensorboard import TENSORBOARD_EXTRA, EventWriter, Scalars

FLUSH_SECONDS = 5.0  # the event file reaches the disk at least this often


def check_installed() -> None:
    """ConfigError (said once by rank 0) when --tensorboard cannot write."""
    if importlib.util.find_spec("tensorboard") is None:
        from mpirl.config import ConfigError

        raise ConfigError(f"tensorboard=True needs the tensorboard package: {TENSORBOARD_EXTRA}")


class TensorBoardMirror:
    """A `RunLog` mirror: ``write(stream, columns)`` for each flushed block, ``close()``."""

    def __init__(self, logdir: str | Path, log):
        self.scalars = Scalars(float(log.file.attrs["t0_unix"]))
        self.writer = EventWriter(logdir, flush_secs=FLUSH_SECONDS)

    def write(self, stream: str, cols: dict) -> None:
        self.writer.add(self.scalars.rows(stream, cols))

    def close(self) -> None:
        self.writer.add(self.scalars.finish())
        self.writer.close()
