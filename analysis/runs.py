"""Find and read mpirl run folders with plain h5py: finished, still being written, or killed.

A run folder holds ``learner.h5`` (that is what marks it), ``buffer-<site>.h5``,
``actor-<rank>.h5`` and, once the learner finished, ``summary.json``.

Reading rules (see mpirl's log docstring; nothing here imports mpirl):

- Files are opened with ``h5py.File(path, "r", locking=False)``: that works while the writer
  still has the file open. Each file is opened, read completely and closed; an open or read that
  overlaps the writer's flush can fail, so it is retried a few times.
- The fields of one stream can differ in length (a kill or a read during a flush): every field is
  cut to the shortest one.
- Without ``summary.json`` (a live or killed run) the summary comes from the learner file's
  attributes (the learner sets them when it stops) or, failing that, is derived from the streams;
  `Run.summary_source` says which.
- Times: every stream's ``t`` is seconds since *its file's* ``t0_unix``. `load_run` puts every
  stream on one clock: **seconds since the learner's loop start**, the clock of ``summary.json``'s
  ``wall_s`` and ``time_to_target_s``. The loop starts after the learner's imports and setup
  (seconds after its file's t = 0, more on a loaded machine), so this clock also lines up runs
  whose start-up took different times. The loop start on the learner file's clock is the
  ``loop_start_t`` attribute the learner records when its loop starts. For runs without it, it is
  estimated: the first ``/link`` row's ``t - interval_s`` (that row closes the interval that
  began with the loop; tens of ms late on a loaded machine), else the first ``/progress`` row's
  ``t - progress_seconds``, else 0. Other files are shifted
  by ``t0_unix(file) - t0_unix(learner)`` first. `Run.loop_start` keeps the shift.
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h5py
import numpy as np

__all__ = ["H5Data", "Run", "find_runs", "load_experiment", "load_run", "read_h5", "read_stream"]

Streams = dict[str, dict[str, np.ndarray]]


#: a folder the sweep set aside (``<run>.incomplete-<n>``, `mpirl.sweep`): a partial run
SET_ASIDE = re.compile(r"\.incomplete-\d+$")


def find_runs(root: str | Path) -> list[Path]:
    """Every folder under ``root`` (any depth, ``root`` included) that holds ``learner.h5``,
    except those the sweep set aside as incomplete (``*.incomplete-<n>``, kept beside the rerun
    of the same run; ``root`` itself is read whatever its name)."""
    root = Path(root)
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not SET_ASIDE.search(d))
        if "learner.h5" in filenames:
            found.append(Path(dirpath))
    return sorted(found)


def _attr(v: Any) -> Any:
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    if isinstance(v, np.ndarray):
        if v.dtype.kind in "OS":
            return [_attr(x) for x in v.tolist()]
        return v
    if isinstance(v, np.generic):
        return v.item()
    return v


def read_stream(group: h5py.Group) -> dict[str, np.ndarray]:
    """All fields of one stream group as arrays, cut to the shortest field.

    Fields are taken in the group's ``fields`` attribute order when present (the writer's
    declaration order), else in the group's key order.
    """
    names = [str(_attr(k)) for k in group.attrs.get("fields", list(group.keys()))]
    names = [k for k in names if isinstance(group.get(k), h5py.Dataset)]
    n = min((group[k].shape[0] for k in names), default=0)
    return {k: group[k][:n] for k in names}


@dataclass
class H5Data:
    """Everything in one run log file: root attributes and every stream."""

    path: Path
    attrs: dict[str, Any]
    streams: Streams

    def stream(self, name: str) -> dict[str, np.ndarray]:
        """Stream ``name`` ({} when the file has no such stream yet)."""
        return self.streams.get(name, {})

    @property
    def t0_unix(self) -> float | None:
        v = self.attrs.get("t0_unix")
        return float(v) if v is not None else None


def read_h5(path: str | Path, retries: int = 5, delay: float = 0.2) -> H5Data:
    """Open ``path`` read-only (no HDF5 lock), read attributes and every stream, close.

    Retries ``retries`` times on ``OSError``/``KeyError``/``ValueError``: a read that overlaps
    the writer's flush can fail; flushes take milliseconds.
    """
    path = Path(path)
    for attempt in range(retries + 1):
        try:
            with h5py.File(path, "r", locking=False) as f:
                attrs = {str(k): _attr(v) for k, v in f.attrs.items()}
                streams = {
                    str(name): read_stream(g) for name, g in f.items() if isinstance(g, h5py.Group)
                }
            return H5Data(path, attrs, streams)
        except (OSError, KeyError, ValueError):
            if attempt == retries:
                raise
            time.sleep(delay)
    raise AssertionError("unreachable")


def _json_attr(attrs: dict[str, Any], key: str, default: Any) -> Any:
    v = attrs.get(key)
    if v is None:
        return default
    try:
        return json.loads(v)
    except (TypeError, ValueError):
        return default


@dataclass
class Run:
    """One run folder, read. All times are seconds since the learner's loop start."""

    path: Path
    config: dict[str, Any]
    versions: dict[str, Any]
    layout: list[dict[str, Any]]
    learner: H5Data
    buffers: dict[int, H5Data] = field(default_factory=dict)  # site -> file
    actors: dict[int, H5Data] = field(default_factory=dict)  # rank -> file
    summary: dict[str, Any] = field(default_factory=dict)
    summary_source: str = "summary.json"  # or "learner.h5 attrs", "derived from streams"
    loop_start: float = 0.0  # the learner's loop start, s after learner.h5's t0_unix

    @property
    def replay_at(self) -> str:
        return str(self.config.get("replay_at", "?"))

    @property
    def seed(self) -> Any:
        return self.config.get("seed")

    @property
    def finished(self) -> bool:
        """The learner reached its stop decision and wrote its summary."""
        return self.summary_source != "derived from streams"

    def episodes(self) -> dict[str, np.ndarray]:
        """Every actor's finished episodes, times on the learner's clock, sorted by time."""
        t, ret, length = [], [], []
        for a in self.actors.values():
            ep = a.stream("episodes")
            if "t" in ep and "ret" in ep:
                t.append(ep["t"])
                ret.append(ep["ret"])
                length.append(ep.get("length", np.zeros(len(ep["ret"]), "i8")))
        if not t:
            return {"t": np.zeros(0), "ret": np.zeros(0), "length": np.zeros(0, "i8")}
        tt = np.concatenate(t)
        order = np.argsort(tt, kind="stable")
        return {
            "t": tt[order],
            "ret": np.concatenate(ret)[order],
            "length": np.concatenate(length)[order],
        }

    def _shift(self, other: H5Data) -> float:
        a, b = other.t0_unix, self.learner.t0_unix
        return float(a - b) if a is not None and b is not None else 0.0


SUMMARY_KEYS = (
    "stop_reason",
    "updates",
    "env_steps",
    "wall_s",
    "best_eval",
    "busy_fraction",
    "link_bytes_in",
    "link_bytes_out",
    "time_to_target_s",
    "env_steps_to_target",
    "updates_to_target",
    "target_return",
)


def derive_summary(learner: H5Data, buffers: dict[int, H5Data]) -> tuple[dict[str, Any], str]:
    """The learner's summary when ``summary.json`` is missing: from the learner file's attributes
    if the learner got to write them (it does when it stops), else from the streams.

    From the streams (a live or killed run): ``updates`` = last logged update number,
    ``env_steps`` = the largest count in learner progress/evals or the buffers' site streams
    summed, ``wall_s`` = the last ``t`` in the learner file (`load_run` then makes it
    relative to the loop start), link bytes = the learner's ``link``
    stream summed (the last partial interval is missing), ``best_eval`` = best ``evals/ret_mean``,
    ``stop_reason`` = None.
    """
    a = learner.attrs
    if "stop_reason" in a and "updates" in a:
        return {k: a[k] for k in SUMMARY_KEYS if k in a}, "learner.h5 attrs"
    upd, ev, prog, link = (learner.stream(s) for s in ("updates", "evals", "progress", "link"))
    steps = [0]
    for s in (prog, ev):
        if len(s.get("env_steps", ())):
            steps.append(int(s["env_steps"][-1]))
    site_steps = [
        int(b.stream("site")["env_steps"][-1])
        for b in buffers.values()
        if len(b.stream("site").get("env_steps", ()))
    ]
    steps.append(sum(site_steps))
    t_last = max(
        (float(s["t"][-1]) for s in learner.streams.values() if len(s.get("t", ()))), default=0.0
    )
    rets = ev.get("ret_mean", np.zeros(0))
    summary = {
        "stop_reason": None,
        "updates": int(upd["update"][-1]) if len(upd.get("update", ())) else 0,
        "env_steps": max(steps),
        "wall_s": t_last,
        "best_eval": float(np.max(rets)) if len(rets) else None,
        "link_bytes_in": int(np.sum(link.get("bytes_in", 0))),
        "link_bytes_out": int(np.sum(link.get("bytes_out", 0))),
    }
    return summary, "derived from streams"


def loop_start(learner: H5Data, config: dict[str, Any]) -> float:
    """When the learner's loop started, in s after ``learner.h5``'s t0 (see module docstring):
    the recorded ``loop_start_t`` attribute, else an estimate from the first rows."""
    recorded = learner.attrs.get("loop_start_t")
    if recorded is not None:
        return float(recorded)
    link = learner.stream("link")
    if len(link.get("t", ())) and "interval_s" in link:
        return float(link["t"][0] - link["interval_s"][0])
    prog = learner.stream("progress")
    ps = config.get("progress_seconds")
    if len(prog.get("t", ())) and ps:
        return float(prog["t"][0] - float(ps))
    return 0.0


def load_run(path: str | Path) -> Run:
    """Read one run folder (see the module docstring for live and killed runs)."""
    path = Path(path)
    learner = read_h5(path / "learner.h5")
    buffers, actors = {}, {}
    for p in sorted(path.glob("buffer-*.h5")):
        d = read_h5(p)
        buffers[int(d.attrs.get("site", p.stem.split("-")[-1]))] = d
    for p in sorted(path.glob("actor-*.h5")):
        d = read_h5(p)
        actors[int(d.attrs.get("rank", p.stem.split("-")[-1]))] = d
    summary, source = None, "summary.json"
    sj = path / "summary.json"
    if sj.exists():
        try:
            summary = json.loads(sj.read_text())
        except ValueError:  # being written, or cut by a kill
            summary = None
    if not isinstance(summary, dict):
        summary, source = derive_summary(learner, buffers)
    run = Run(
        path=path,
        config=_json_attr(learner.attrs, "config_json", {}),
        versions=_json_attr(learner.attrs, "versions_json", {}),
        layout=_json_attr(learner.attrs, "layout_json", []),
        learner=learner,
        buffers=buffers,
        actors=actors,
        summary=summary,
        summary_source=source,
    )
    run.loop_start = loop_start(learner, run.config)
    if not run.finished:  # derived wall_s was on the learner file's clock
        run.summary["wall_s"] = float(run.summary.get("wall_s") or 0.0) - run.loop_start
    for d in [learner, *buffers.values(), *actors.values()]:
        dt = (run._shift(d) if d is not learner else 0.0) - run.loop_start
        if dt:
            for s in d.streams.values():
                if "t" in s:
                    s["t"] = s["t"] + dt
    return run


def load_experiment(exp_dir: str | Path) -> tuple[list[Run], list[str]]:
    """Every run folder under ``exp_dir``, read; plus one line per folder that could not be."""
    runs, errors = [], []
    for p in find_runs(exp_dir):
        try:
            runs.append(load_run(p))
        except Exception as e:  # noqa: BLE001 - one unreadable run must not stop the report
            errors.append(f"{p}: {type(e).__name__}: {e}")
    return runs, errors
