"""``--tensorboard``: the learner's and the buffers' log rows mirrored into TensorBoard event
files, live; and the mapping from log rows to scalars that ``python -m analysis.to_tensorboard``
uses offline (analysis imports it from here; mpirl does not import analysis).

Each of those ranks writes its own events (one writer per folder, no MPI traffic): its `RunLog`
hands every stream's rows to `TensorBoardMirror` as it flushes them to HDF5 (every
``--flush-seconds``), so the dashboard costs nothing per update or per batch and shows what the
HDF5 files hold:

- the learner, into ``RUN_DIR/tensorboard``: progress, greedy evaluations, the loss (mean of each
  100 updates), link rates, priorities and the in-flight window per site (`Scalars`);
- buffer ``s``, into ``RUN_DIR/tensorboard/buffer-<s>`` (a run of its own in TensorBoard, so the
  sites share one chart per tag): its ``/site`` counters (replay size, inserted, sampled,
  priority updates, round trip, window, ...), its side of the link, and its sampled batches
  (priority, max weight, beta; mean of each 100 batches) (`BufferScalars`).

=============================================  ===========================  ====================
tag                                            from ``learner.h5``          step
=============================================  ===========================  ====================
``progress/<field>`` (env_steps, env_steps_per  ``/progress``, every row    updates
_s, updates_per_s, recent_return, loss,
busy_fraction, link_bytes_per_s)
``eval/ret_mean``, ``eval/ret_std``,           ``/evals``, every row        update
``eval/ret_min``
``train/loss``, ``train/td_abs_mean``,          ``/updates``, mean of each   last update of the
``train/beta``                                 ``EVERY`` updates            group
``link/site<s>/mb_in_per_s``, ``mb_out_per_s``  ``/link``, every row        seconds since start
, ``utilization``
``link/site<s>/priority_mean``,                ``/transfers``, mean of each last update of the
``arrival_priority_mean``, ``window``          ``EVERY`` updates            group
=============================================  ===========================  ====================

=============================================  ===========================  ====================
tag (run ``buffer-<s>``)                       from ``buffer-<s>.h5``       step
=============================================  ===========================  ====================
``buffer/<field>``, every field of ``/site``   ``/site``, every row (NaN   ms since start
(``SITE``: counters, ``replay_size``,           left out)
``window``, ``rtt_s``, ...)
``buffer/link_mb_out_per_s``, ``_mb_in_per_s``  ``/link``, every row        ms since start
, ``_utilization``, ``_compression`` (raw /
sent bytes)
``buffer/batch_priority_mean``,                ``/batches``, mean of each  last batch id of
``batch_max_weight``, ``batch_beta``,          ``EVERY`` batches            the group
``batch_size`` (last)
=============================================  ===========================  ====================

Every event's wall time is the row's ``t + t0_unix``, so TensorBoard's "Relative" and "Wall"
axes line all tags up. Actors write none (their rows are per episode; ``analysis`` reads them).
A resumed run adds a file in each folder and its steps continue. View with
``tensorboard --logdir RUN_DIR``. Needs the tensorboard package (``pip install -e
".[tensorboard]"``).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from mpirl.errors import ConfigError

if TYPE_CHECKING:
    from mpirl.logs.runlog import RunLog

__all__ = [
    "EVERY",
    "SCALARS",
    "SITE",
    "BufferScalars",
    "EventWriter",
    "Scalars",
    "TensorBoardMirror",
    "check_installed",
]

EVERY = 100  # updates per point of the per-update series
TENSORBOARD_EXTRA = 'pip install -e ".[tensorboard]"'
PROGRESS = (
    "env_steps",
    "env_steps_per_s",
    "updates_per_s",
    "recent_return",
    "loss",
    "busy_fraction",
    "link_bytes_per_s",
    "sync_mode",
)
#: the buffer's /site fields, all mirrored (counters so far, the memory, the in-flight window)
SITE = (
    "env_steps",
    "inserted",
    "sampled",
    "replay_size",
    "forward_queue",
    "forwarded",
    "forward_dropped",
    "thinned",
    "inflight",
    "window",
    "rtt_s",
    "rtt_net_s",
    "step_s",
    "throttled",
    "stale_dropped",
    "too_stale",
    "prio_received",
    "prio_applied",
    "prio_moved",
)


class _Groups:
    """Means of consecutive rows grouped by ``key // EVERY``; a group is emitted once a later
    group has begun (so the live mirror and the offline converter give the same points), the
    last one by `finish`."""

    def __init__(self, fields: tuple[str, ...], last: tuple[str, ...] = ()) -> None:
        self.fields, self.last = fields, last  # ``last``: take the group's last value
        self.pending: dict[str, np.ndarray] | None = None

    def add(
        self, cols: dict[str, np.ndarray], key: str, done: bool = False
    ) -> Iterator[tuple[int, float, dict[str, float]]]:
        """Yield (group's last key, last t, {field: value}) for each complete group."""
        names = ("t", key, *self.fields, *self.last)
        cols = {k: np.asarray(cols[k]) for k in names if k in cols}
        if self.pending is not None:
            cols = {
                k: np.concatenate([p, cols[k]]) if k in cols else p for k, p in self.pending.items()
            }
        if not len(cols[key]):
            return
        g = cols[key] // EVERY
        ends = np.flatnonzero(np.diff(g)) + 1
        starts = np.concatenate([[0], ends])
        stops = np.concatenate([ends, [len(g)]])
        complete = len(starts) if done else len(starts) - 1
        for a, b in zip(starts[:complete], stops[:complete], strict=True):
            vals = {f: float(np.mean(cols[f][a:b])) for f in self.fields if f in cols}
            vals.update({f: float(cols[f][b - 1]) for f in self.last if f in cols})
            yield int(cols[key][b - 1]), float(cols["t"][b - 1]), vals
        self.pending = None if done else {k: v[starts[-1] :] for k, v in cols.items()}


class Scalars:
    """learner.h5 rows -> TensorBoard scalars ``(tag, step, value, wall_time)``; feed each
    stream's new rows in order (`rows`), then `finish` once at the end."""

    def __init__(self, t0_unix: float) -> None:
        self.t0 = float(t0_unix)
        self.updates = _Groups(("loss", "td_abs_mean", "beta"))
        self.transfers: dict[int, _Groups] = {}

    def rows(self, stream: str, cols: dict[str, np.ndarray], done: bool = False) -> list[tuple]:
        out = []
        t = np.asarray(cols.get("t", []), np.float64)
        if stream == "progress":
            for i in range(len(t)):
                for f in PROGRESS:
                    if f in cols:
                        out.append(
                            (
                                f"progress/{f}",
                                int(cols["updates"][i]),
                                float(cols[f][i]),
                                self.t0 + t[i],
                            )
                        )
        elif stream == "evals":
            for i in range(len(t)):
                for f in ("ret_mean", "ret_std", "ret_min"):
                    out.append(
                        (f"eval/{f}", int(cols["update"][i]), float(cols[f][i]), self.t0 + t[i])
                    )
        elif stream == "updates":
            for step, tt, vals in self.updates.add(cols, "update", done):
                out += [(f"train/{f}", step, v, self.t0 + tt) for f, v in vals.items()]
        elif stream == "link":
            for i in range(len(t)):
                s, dt = int(cols["buffer"][i]), max(float(cols["interval_s"][i]), 1e-9)
                for tag, v in (
                    ("mb_in_per_s", cols["bytes_in"][i] / dt / 1e6),
                    ("mb_out_per_s", cols["bytes_out"][i] / dt / 1e6),
                    ("utilization", cols["utilization"][i]),
                ):
                    out.append((f"link/site{s}/{tag}", int(t[i]), float(v), self.t0 + t[i]))
        elif stream == "transfers":
            sites = np.asarray(cols.get("buffer", []))
            for s in sorted(set(sites.tolist()) | (set(self.transfers) if done else set())):
                g = self.transfers.setdefault(
                    s, _Groups(("priority_mean", "arrival_priority_mean"), last=("window",))
                )
                mine = {k: np.asarray(v)[sites == s] for k, v in cols.items()}
                for step, tt, vals in g.add(mine, "update", done):
                    out += [
                        (f"link/site{s}/{f}", step, v, self.t0 + tt)
                        for f, v in vals.items()
                        if f != "window" or v > 0
                    ]
        return out

    def finish(self) -> list[tuple]:
        """The last, incomplete groups of the per-update series."""
        empty = {"t": np.zeros(0), "update": np.zeros(0, np.int64), "buffer": np.zeros(0, int)}
        return self.rows("updates", empty, done=True) + self.rows("transfers", empty, done=True)


class BufferScalars:
    """buffer-<s>.h5 rows -> TensorBoard scalars, as `Scalars` does for learner.h5 (the second
    table of the module docstring).  /site and /link rows come every half ``--flush-seconds``,
    so their step is milliseconds since the start (seconds would repeat); NaN values (no round
    trip measured in the interval) are left out."""

    def __init__(self, t0_unix: float) -> None:
        self.t0 = float(t0_unix)
        self.batches = _Groups(("priority_mean", "max_weight", "beta"), last=("size",))

    def rows(self, stream: str, cols: dict[str, np.ndarray], done: bool = False) -> list[tuple]:
        out = []
        t = np.asarray(cols.get("t", []), np.float64)
        ms = np.round(t * 1000).astype(np.int64)
        if stream == "site":
            for i in range(len(t)):
                out += [
                    (f"buffer/{f}", int(ms[i]), float(cols[f][i]), self.t0 + t[i])
                    for f in SITE
                    if f in cols and np.isfinite(cols[f][i])
                ]
        elif stream == "link":
            for i in range(len(t)):
                dt, sent = max(float(cols["interval_s"][i]), 1e-9), int(cols["bytes_out"][i])
                vals = {
                    "mb_out_per_s": sent / dt / 1e6,
                    "mb_in_per_s": cols["bytes_in"][i] / dt / 1e6,
                    "utilization": cols["utilization"][i],
                }
                if sent > 0:
                    vals["compression"] = cols["raw_bytes_out"][i] / sent
                out += [
                    (f"buffer/link_{k}", int(ms[i]), float(v), self.t0 + t[i])
                    for k, v in vals.items()
                ]
        elif stream == "batches":
            for step, tt, vals in self.batches.add(cols, "batch", done):
                out += [(f"buffer/batch_{f}", step, v, self.t0 + tt) for f, v in vals.items()]
        return out

    def finish(self) -> list[tuple]:
        """The last, incomplete group of /batches."""
        return self.rows("batches", {"t": np.zeros(0), "batch": np.zeros(0, np.int64)}, done=True)


#: the scalars of each role's file, and its streams in the order the converter reads them
SCALARS: dict[str, tuple[type[Scalars] | type[BufferScalars], tuple[str, ...]]] = {
    "learner": (Scalars, ("progress", "evals", "updates", "link", "transfers")),
    "buffer": (BufferScalars, ("site", "link", "batches")),
}


class EventWriter:
    """Scalars into a TensorBoard event file (tensorboard's own writer; no torch, no TF)."""

    def __init__(self, logdir: str | Path, flush_secs: float = 120) -> None:
        try:
            from tensorboard.compat.proto.event_pb2 import Event
            from tensorboard.compat.proto.summary_pb2 import Summary
            from tensorboard.summary.writer.event_file_writer import EventFileWriter
        except ImportError:
            raise ImportError(
                f"TensorBoard event files need the tensorboard package: {TENSORBOARD_EXTRA}"
            ) from None
        self._event, self._summary = Event, Summary
        self._writer = EventFileWriter(str(logdir), flush_secs=flush_secs)

    def add(self, scalars: list[tuple]) -> None:
        for tag, step, value, wall in scalars:
            summary = self._summary(value=[self._summary.Value(tag=tag, simple_value=value)])
            self._writer.add_event(self._event(wall_time=wall, step=step, summary=summary))

    def flush(self) -> None:
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


FLUSH_SECONDS = 5.0  # the event file reaches the disk at least this often


def check_installed() -> None:
    """ConfigError when --tensorboard cannot write (checked at the learner and the buffers,
    mpirl.run.resources)."""
    if importlib.util.find_spec("tensorboard") is None:
        raise ConfigError(f"tensorboard=True needs the tensorboard package: {TENSORBOARD_EXTRA}")


class TensorBoardMirror:
    """A `RunLog` mirror: ``write(stream, columns)`` for each flushed block, ``close()``;
    ``role``: whose rows they are (learner or buffer)."""

    def __init__(self, logdir: str | Path, log: RunLog, role: str = "learner") -> None:
        self.scalars = SCALARS[role][0](float(log.file.attrs["t0_unix"]))
        self.writer = EventWriter(logdir, flush_secs=FLUSH_SECONDS)

    def write(self, stream: str, cols: dict) -> None:
        self.writer.add(self.scalars.rows(stream, cols))

    def close(self) -> None:
        self.writer.add(self.scalars.finish())
        self.writer.close()
