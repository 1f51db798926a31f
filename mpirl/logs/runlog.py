"""Run logs: a fixed schema per stream, appended to HDF5, flushed on a cadence.

One `RunLog` is one HDF5 file with one writer (h5py from PyPI has no parallel HDF5, so each
rank writes its own file). Layout, readable with plain h5py, pandas or h5dump::

    /                      attrs: run-level (config_json, versions, hosts, layout, t0_unix, ...)
    /<stream>/             attrs: doc, fields (column names in declaration order)
    /<stream>/<field>      dataset (rows, *shape), chunked, maxshape (None, *shape),
                           attrs: units, doc

Time: every stream has a field ``t`` (f8, seconds since run start, first unless declared
elsewhere). `Stream.append`/`extend` fill it with ``time.monotonic() - RunLog.t0`` unless the
caller passes ``t=``. The wall-clock start is the file attribute ``t0_unix``; a resumed log keeps
that origin (``t`` continues across restarts, bridged by the wall clock), and adds its own start
to ``resumed_unix``.

Why it is built this way (measured with h5py 3.16 / HDF5 2.0 on this 2-core machine):

- One HDF5 write costs 0.2-0.8 ms whatever its row count, so rows are buffered in Python
  (append: about 2-3 us for 6 scalar fields here) and written once per ``flush_seconds``: one
  extend + write per field, then ``File.flush()``. HDF5 is touched only inside `RunLog.flush`
  (and stream/attr creation, which flush at once), so between flushes the file on disk is
  complete.
- Default file format (no ``libver="latest"``, no SWMR): after SIGKILL such files open normally
  with every row up to the last flush (also 40/40 kills of a writer that flushed after every row,
  so most kills hit a flush); ``libver="latest"`` without SWMR left unopenable files, and SWMR
  files opened only in SWMR-read mode. No compression, so chunks never move on disk.
- The writer opens the file with HDF5 file locking off, so even a plain ``h5py.File(path, "r")``
  opens a live file (with HDF5's default locking a reader gets ``BlockingIOError: unable to lock
  file`` while the writer runs). A second writer is refused by a lock this module takes itself
  (`RunLog._lock`). See `open_for_reading` for reading live files.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import struct
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple, Protocol

import h5py
import numpy as np

__all__ = ["Field", "RunLog", "Stream", "open_for_reading", "read_stream"]

FORMAT_VERSION = 1
_CHUNK_BYTES = 32 * 1024  # target bytes per chunk of one field
# Per-dataset chunk cache of the writer: appends touch one or two chunks at a time, and h5py's
# default cache (8 MiB per dataset here) kept each dataset's last 8 MiB in memory, ~110 MB of
# RSS growth for a learner log of ~14 fields after 1M rows (docs/hdf5.md).
_CHUNK_CACHE_BYTES = 2 * _CHUNK_BYTES
_COMPACT_ROWS = 4096  # buffered dict rows are packed into column arrays past this many
_OPEN_PATHS: set[str] = set()  # files written by this process (record locks do not see these)


class Field(NamedTuple):
    """One column of a stream: ``shape`` is the per-row shape (``()`` for scalars)."""

    name: str
    dtype: str
    unit: str
    doc: str
    shape: tuple = ()


T_FIELD = Field("t", "f8", "s", "seconds since run start (RunLog t0; file attr t0_unix)")


def open_for_reading(path: str | Path) -> h5py.File:
    """Open a run log read-only, whether its writer is running, finished or was killed.

    The plain-h5py equivalent (no mpirl needed)::

        h5py.File(path, "r", locking=False)       # h5py >= 3.5
        # or: HDF5_USE_FILE_LOCKING=FALSE in the environment (h5dump, h5ls, pandas, old h5py)

    Files written by `RunLog` do not hold an HDF5 lock, so ``h5py.File(path, "r")`` works on them
    too; ``locking=False`` also covers files whose writer does lock (any other HDF5 writer), where
    the default open fails with ``BlockingIOError ... unable to lock file``.

    Caveats for a live file (its writer still running):

    - You see the rows of completed flushes. Open, read what you need, close; reopen to see newer
      rows. An open file does not follow the writer (SWMR would, but SWMR files do not survive
      SIGKILL), and h5py reads each dataset's size when you first touch it.
    - Fields of one stream can differ in length: a field read after the writer's next flush is
      longer. Truncate every field to the shortest one (`read_stream` does). After a kill they
      were equal in every trial, but truncate anyway.
    - A read that overlaps a flush can fail (seen: ``OSError: Can't synchronously read data (addr
      overflow ...)``, 4 in 8,000 reads against a writer flushing nonstop). Retry after a moment;
      at the default cadence a flush takes milliseconds every 2 s.
    - Reading in the writer's own process gives HDF5's shared handle to the open file (mode
      ``r+``; you see flushed rows only, as elsewhere).
    """
    return h5py.File(path, "r", locking=False)


def read_stream(f: h5py.File, name: str) -> dict[str, np.ndarray]:
    """All columns of stream ``name`` as arrays, truncated to the shortest field.

    Plain h5py: ``g = f[name]; n = min(d.shape[0] for d in g.values());
    cols = {k: d[:n] for k, d in g.items()}``.
    """
    g = f[name]
    names = [str(k) for k in g.attrs.get("fields", list(g.keys()))]
    n = min((g[k].shape[0] for k in names), default=0)
    return {k: g[k][:n] for k in names}


def _attr_value(key: str, value: Any) -> Any:
    """Convert ``value`` to something HDF5 stores as an attribute; dicts and None become JSON."""
    if value is None or isinstance(value, dict):
        return json.dumps(value, sort_keys=True, default=str)
    if isinstance(value, (str, bytes, bool, int, float, np.generic)):
        return value
    if isinstance(value, (list, tuple, np.ndarray)):
        arr = np.asarray(value) if len(value) else np.zeros(0, "f8")
        if arr.dtype.kind in "biuf":
            return arr
        if arr.dtype.kind == "U":
            return np.array([str(v) for v in arr.ravel()], dtype=h5py.string_dtype()).reshape(
                arr.shape
            )
        return json.dumps(list(value), default=str)  # mixed or nested lists
    raise TypeError(
        f"run attribute {key}={value!r} has type {type(value).__name__}; "
        "use str, int, float, bool, a list/array of those, or a dict (stored as JSON)"
    )


def missing_value(dt: np.dtype) -> Any:
    """What a row holds in a field it was written without: NaN (floats), -1 (signed integers),
    0 (anything else: HDF5's default fill)."""
    return np.nan if dt.kind in "fc" else -1 if dt.kind == "i" else 0


def _create_column(g: h5py.Group, f: Field, rows: int) -> None:
    """One field's resizable, chunked dataset in stream group ``g``, ``rows`` long (filled with
    the missing value: a field added to a stream that already has rows)."""
    dt = _dtype(f)
    shape = tuple(f.shape)
    row_bytes = max(1, dt.itemsize * int(np.prod(shape, dtype=np.int64)))
    chunk_rows = max(1, _CHUNK_BYTES // row_bytes)
    ds = g.create_dataset(
        f.name,
        shape=(rows, *shape),
        maxshape=(None, *shape),
        dtype=dt,
        chunks=(chunk_rows, *shape),
        fillvalue=missing_value(dt) if rows and dt.kind in "fci" else None,
    )
    ds.attrs["units"] = f.unit
    ds.attrs["doc"] = f.doc


def _dtype(field: Field) -> np.dtype:
    try:
        dt = np.dtype(field.dtype)
    except TypeError as e:
        raise ValueError(f"field {field.name!r}: dtype={field.dtype!r} is not a numpy dtype") from e
    if dt.kind in "OUMmV":
        raise ValueError(
            f"field {field.name!r}: dtype={field.dtype!r} cannot be logged; "
            "use a fixed-size numeric dtype ('f8', 'f4', 'i8', 'u1', ...) or bytes ('S16')"
        )
    return dt


class Stream:
    """One table of rows with a fixed set of fields; rows are buffered until the log flushes.

    Get one from `RunLog.stream`. ``rows_written`` counts rows on disk, ``rows_pending`` rows
    still buffered.
    """

    def __init__(self, log: RunLog, group: h5py.Group, fields: list[Field], n: int) -> None:
        self.name = group.name.lstrip("/")
        self.fields = fields
        self.rows_written = n
        self._log = log
        self._group = group
        self._dtypes = {f.name: _dtype(f) for f in fields}
        self._shapes = {f.name: tuple(f.shape) for f in fields}
        self._names = frozenset(self._dtypes)
        self._rows: list[dict[str, Any]] = []  # rows from append, not yet packed
        self._blocks: list[dict[str, np.ndarray]] = []  # packed column blocks
        self._n_blocks = 0
        self._t0 = log.t0
        self._dsids = {name: group[name].id for name in self._dtypes}

    @property
    def rows_pending(self) -> int:
        return len(self._rows) + self._n_blocks

    def append(self, **row: Any) -> None:
        """Buffer one row: every field by name (``t`` optional). Flushes the log when due.

        Names are checked here; values when rows are packed (every 4096 rows, or at flush),
        which raises naming the bad row, drops it and keeps the others.
        """
        now = time.monotonic()
        if "t" not in row:
            row["t"] = now - self._t0
        if row.keys() != self._names:
            self._bad_keys(row.keys())
        rows = self._rows
        rows.append(row)
        if len(rows) >= _COMPACT_ROWS:
            self._pack()
        if now >= self._log._next_flush:
            self._log.flush(now)

    def extend(self, **columns: Any) -> None:
        """Buffer many rows: one array per field, all of the same length (``t`` optional)."""
        now = time.monotonic()
        if columns.keys() - {"t"} != self._names - {"t"}:
            self._bad_keys(columns.keys() | {"t"})
        lengths = {k: len(v) for k, v in columns.items()}
        if len(set(lengths.values())) > 1:
            raise ValueError(f"stream {self.name!r}: extend needs equal lengths, got {lengths}")
        k = next(iter(lengths.values()))
        if "t" not in columns:
            columns["t"] = np.full(k, now - self._t0)
        block = {name: self._column(name, columns[name], k) for name in self._dtypes}
        self._pack()  # rows appended before these go first
        self._blocks.append(block)
        self._n_blocks += k
        if now >= self._log._next_flush:
            self._log.flush(now)

    def _closed_error(self, **_: Any) -> None:
        raise RuntimeError(f"stream {self.name!r}: append/extend after RunLog.close()")

    def _bad_keys(self, keys: Any) -> None:
        missing = sorted(self._names - set(keys))
        extra = sorted(set(keys) - self._names)
        raise ValueError(
            f"stream {self.name!r}: row has missing fields {missing} and unknown fields {extra}; "
            f"its fields are {[f.name for f in self.fields]}"
        )

    def _column(self, name: str, values: Any, k: int) -> np.ndarray:
        dt, shape = self._dtypes[name], self._shapes[name]
        arr = np.asarray(values)
        if arr.dtype != dt and arr.dtype.kind in "biuf" and dt.kind in "biuf":
            if dt.kind in "iu" and arr.dtype.kind in "iuf":  # exact integers in range only
                info = np.iinfo(dt)
                with np.errstate(invalid="ignore"):
                    fits = bool(np.all((arr >= info.min) & (arr <= info.max) & (arr % 1 == 0)))
                if not fits:
                    raise TypeError(
                        f"stream {self.name!r} field {name!r}: values {arr.ravel()[:5]}... are "
                        f"not all integers in [{info.min}, {info.max}] for dtype {dt}; "
                        "round them or declare the field with another dtype"
                    )
            elif not np.can_cast(arr.dtype, dt, "same_kind"):
                raise TypeError(
                    f"stream {self.name!r} field {name!r}: values of dtype {arr.dtype} cannot "
                    f"be stored as {dt}; cast them or declare the field with another dtype"
                )
        try:
            arr = arr.astype(dt, copy=False)
        except (TypeError, ValueError) as e:
            raise TypeError(
                f"stream {self.name!r} field {name!r}: cannot store {values!r:.80} as {dt}"
            ) from e
        if arr.shape != (k, *shape):
            raise ValueError(
                f"stream {self.name!r} field {name!r}: got shape {arr.shape} for {k} rows, "
                f"expected {(k, *shape)} (Field.shape={shape})"
            )
        return arr

    def _pack(self) -> None:
        rows, self._rows = self._rows, []
        if rows:
            k = len(rows)
            try:
                block = {n: self._column(n, [r[n] for r in rows], k) for n in self._dtypes}
            except (TypeError, ValueError):
                self._pack_good_rows(rows)
                raise
            self._blocks.append(block)
            self._n_blocks += k

    def _pack_good_rows(self, rows: list[dict[str, Any]]) -> None:
        """Keep the rows that convert, drop the others and raise naming the first bad one."""
        good, bad = [], []
        for i, r in enumerate(rows):
            try:
                good.append({n: self._column(n, [r[n]], 1) for n in self._dtypes})
            except (TypeError, ValueError) as e:
                bad.append((i, r, e))
        if good:
            self._blocks.append({n: np.concatenate([b[n] for b in good]) for n in self._dtypes})
            self._n_blocks += len(good)
        if not bad:
            return
        i, r, err = bad[0]  # (not `e`: the except clause above unbinds that name)
        raise type(err)(
            f"{err} (dropped {len(bad)} of {len(rows)} buffered rows; "
            f"first bad row #{i}: {r!r:.200})"
        ) from err

    def _write(self) -> None:
        """Append the buffered rows to the datasets (no HDF5 flush)."""
        self._pack()
        if not self._n_blocks:
            self._blocks = []
            return
        n0, k = self.rows_written, self._n_blocks
        cols = {}
        for name, dsid in self._dsids.items():
            cols[name] = col = np.ascontiguousarray(np.concatenate([b[name] for b in self._blocks]))
            # Low-level calls: a third of the time of ds.resize + ds[a:b] = col (measured).
            dsid.set_extent((n0 + k, *col.shape[1:]))
            space = dsid.get_space()
            space.select_hyperslab((n0,) + (0,) * (col.ndim - 1), col.shape)
            dsid.write(h5py.h5s.create_simple(col.shape), space, col)
        self._blocks, self._n_blocks = [], 0
        self.rows_written = n0 + k
        if self._log.mirror is not None:
            self._log._to_mirror(self.name, cols)


class Mirror(Protocol):
    """A second sink for a `RunLog`'s flushed rows (`mpirl.logs.dashboard.TensorBoardMirror`)."""

    def write(self, stream: str, cols: dict[str, np.ndarray]) -> None: ...

    def close(self) -> None: ...


class RunLog:
    """One HDF5 file of streams plus run attributes; one writer per file.

    ``flush_seconds``: buffered rows go to disk when an append or `maybe_flush` finds that this
    long has passed since the last flush; a loop that may sit idle calls `maybe_flush` itself.
    ``resume=True`` reopens an existing file and continues its streams (fields cut to their
    shortest length first, in case the previous writer was killed during a flush).
    ``t0`` is the `time.monotonic` value of run start: ``t = time.monotonic() - t0``.
    ``mirror``: an optional second sink (``write(stream, columns)``, ``close()``; e.g. the
    TensorBoard writer of mpirl.logs.dashboard) that gets every stream's rows as they are flushed to
    HDF5; a failing mirror is dropped with one warning, the HDF5 log goes on.
    """

    mirror: Mirror | None = None
    _flushing = False

    def __init__(
        self,
        path: str | Path,
        attrs: dict[str, Any],
        flush_seconds: float = 2.0,
        resume: bool = False,
    ) -> None:
        if not flush_seconds >= 0:
            raise ValueError(f"flush_seconds={flush_seconds} must be >= 0")
        self.path = Path(path)
        self.flush_seconds = float(flush_seconds)
        self.streams: dict[str, Stream] = {}
        self._before: list[Callable[[], None]] = []  # before_flush callbacks
        self._closed = True
        stored = {k: _attr_value(k, v) for k, v in attrs.items()}  # fail before creating a file
        key = os.path.realpath(self.path)
        if key in _OPEN_PATHS:
            raise RuntimeError(f"{self.path} is already open for writing in this process")
        exists = self.path.exists()
        if exists and not resume:
            raise FileExistsError(
                f"run log {self.path} exists; pass resume=True to continue it, "
                "or choose a new path (runs are never overwritten)"
            )
        if resume and not exists:
            raise FileNotFoundError(
                f"run log {self.path} does not exist; pass resume=False to start a new run"
            )
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # Our own lock against a second writer; HDF5's lock is off so that readers can open.
        self._lock_fd = os.open(self.path, os.O_RDWR | os.O_CREAT | (0 if resume else os.O_EXCL))
        try:
            self._lock()
            self.file = h5py.File(
                self.path, "r+" if resume else "w", locking=False, rdcc_nbytes=_CHUNK_CACHE_BYTES
            )
        except BaseException:
            os.close(self._lock_fd)
            if not resume:
                self.path.unlink(missing_ok=True)
            raise
        _OPEN_PATHS.add(key)
        self._key = key
        self._closed = False
        now_unix, now = time.time(), time.monotonic()
        if resume:
            t0_unix = float(self.file.attrs.get("t0_unix", now_unix))
            self.t0 = now - (now_unix - t0_unix)
            resumed = list(np.atleast_1d(self.file.attrs.get("resumed_unix", [])))
            self.file.attrs["resumed_unix"] = np.array([*resumed, now_unix], "f8")
        else:
            self.t0 = now
            self.file.attrs["t0_unix"] = now_unix
            self.file.attrs["log_format"] = FORMAT_VERSION
            self.file.attrs["writer_host"] = socket.gethostname()
            self.file.attrs["writer_pid"] = os.getpid()
        self.file.attrs["flush_seconds"] = self.flush_seconds
        for k, v in stored.items():
            self.file.attrs[k] = v
        self.file.flush()
        self._next_flush = now + self.flush_seconds

    def _lock(self) -> None:
        """Take a write lock on the file so that a second writer fails fast.

        An open-file-description lock (Linux ``F_OFD_SETLK``): unlike ``lockf``, it is not
        dropped when HDF5 closes one of its own descriptors of the file, and it does not
        conflict with the ``flock`` that HDF5 readers take.
        """
        try:
            if hasattr(fcntl, "F_OFD_SETLK"):
                lk = struct.pack("@hhqqi", fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0).ljust(64, b"\0")
                fcntl.fcntl(self._lock_fd, fcntl.F_OFD_SETLK, lk)
            else:
                fcntl.lockf(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno in (errno.EAGAIN, errno.EACCES):
                raise RuntimeError(
                    f"run log {self.path} is being written by another process; "
                    "one writer per file: give each rank its own path"
                ) from e
            # File system without record locks (ENOLCK, EINVAL...): go on unguarded.

    def elapsed(self) -> float:
        """Seconds since run start, on the same clock as the ``t`` field."""
        return time.monotonic() - self.t0

    def stream(self, name: str, fields: list[Field], doc: str = "") -> Stream:
        """Declare (or, on resume, reopen) stream ``name``; field ``t`` is added first if absent."""
        self._check_open()
        if not name or name.startswith("/"):
            raise ValueError(f"stream name {name!r} must be non-empty and not start with '/'")
        fields = [Field(*f) for f in fields]
        names = [f.name for f in fields]
        if len(set(names)) != len(names):
            raise ValueError(f"stream {name!r}: duplicate field names in {names}")
        if "t" in names:
            tf = fields[names.index("t")]
            if np.dtype(tf.dtype) != np.float64 or tf.unit != "s" or tuple(tf.shape) != ():
                raise ValueError(
                    f"stream {name!r}: field 't' must be a scalar 'f8' in unit 's', got {tf}; "
                    "leave it out and it is added for you"
                )
        else:
            fields = [T_FIELD, *fields]
        for f in fields:
            _dtype(f)
        if name in self.streams:
            old = self.streams[name]
            self._check_same(name, [tuple(f) for f in old.fields], [tuple(f) for f in fields])
            return old
        if name in self.file:
            stream = self._reopen(name, fields, doc)
        else:
            g = self.file.create_group(name)
            g.attrs["doc"] = doc
            g.attrs["fields"] = np.array([f.name for f in fields], dtype=h5py.string_dtype())
            for f in fields:
                _create_column(g, f, 0)
            stream = Stream(self, g, fields, 0)
            self.file.flush()
        self.streams[name] = stream
        return stream

    @staticmethod
    def _check_same(name: str, have: list[tuple], want: list[tuple]) -> None:
        def key(fs: list[tuple]) -> dict:
            return {f[0]: (str(np.dtype(f[1])), f[2], tuple(f[4])) for f in fs}

        h, w = key(have), key(want)
        if h != w:
            diff = {
                k: (h.get(k), w.get(k)) for k in sorted(h.keys() | w.keys()) if h.get(k) != w.get(k)
            }
            raise ValueError(
                f"stream {name!r} exists with other fields; (dtype, unit, shape) as (existing, "
                f"requested): {diff}. Use a new stream name, or a new run file"
            )

    def _reopen(self, name: str, fields: list[Field], doc: str) -> Stream:
        g = self.file[name]
        if not isinstance(g, h5py.Group):
            raise TypeError(f"{name!r} in {self.path} is a dataset, not a stream group")
        have = []
        for k, ds in g.items():
            have.append((k, str(ds.dtype), str(ds.attrs.get("units", "")), "", ds.shape[1:]))
        # a field this version adds to a stream (a run begun before it, resumed now): the rows
        # already written get the missing value; any other difference is an error
        added = [f for f in fields if f.name not in g]
        self._check_same(name, have, [tuple(f) for f in fields if f.name in g])
        n = min(g[f.name].shape[0] for f in fields if f.name in g)
        for f in fields:  # a kill during a flush can leave some fields longer
            if f.name in g and g[f.name].shape[0] != n:
                g[f.name].resize(n, axis=0)
        for f in added:
            _create_column(g, f, n)
            g[f.name].attrs["added_at_row"] = n
        if added:
            g.attrs["fields"] = np.array([f.name for f in fields], dtype=h5py.string_dtype())
        if doc:
            g.attrs["doc"] = doc
        self.file.flush()
        return Stream(self, g, fields, n)

    def set_attrs(self, **attrs: Any) -> None:
        """Set run attributes (dicts and None are stored as JSON strings); written at once."""
        self._check_open()
        for k, v in attrs.items():
            self.file.attrs[k] = _attr_value(k, v)
        self.file.flush()

    def _to_mirror(self, stream: str, cols: dict[str, np.ndarray]) -> None:
        assert self.mirror is not None  # the callers check
        try:
            self.mirror.write(stream, cols)
        except Exception as e:  # noqa: BLE001 - the HDF5 log is the source of truth: keep it
            mirror, self.mirror = self.mirror, None
            print(
                f"mpirl: warning: {type(mirror).__name__} failed ({type(e).__name__}: {e}); "
                f"it stops, {self.path.name} goes on",
                file=sys.stderr,
                flush=True,
            )

    def before_flush(self, fn: Callable[[], None]) -> None:
        """Call ``fn()`` at the start of every flush (and so at `close`): a writer that holds
        rows back to append them in blocks (mpirl.roles.learner's per-update rows) hands them over
        there, so the file on disk never misses rows it would have had."""
        self._before.append(fn)

    def maybe_flush(self, now: float | None = None) -> bool:
        """Flush if ``flush_seconds`` passed since the last one (``now``: time.monotonic())."""
        now = time.monotonic() if now is None else now
        if now >= self._next_flush:
            self.flush(now)
            return True
        return False

    def flush(self, now: float | None = None) -> None:
        """Write every stream's buffered rows, then flush HDF5 so the file on disk is complete."""
        self._check_open()
        if self._flushing:  # an append from a before_flush callback: this flush writes it
            return
        error = None
        self._flushing = True
        try:
            for fn in self._before:
                try:
                    fn()
                except (TypeError, ValueError) as e:  # a bad row: write the others, then raise
                    error = error or e
        finally:
            self._flushing = False
        for s in self.streams.values():
            try:
                s._write()
            except (TypeError, ValueError) as e:
                error = error or e
        self.file.flush()
        self._next_flush = (time.monotonic() if now is None else now) + self.flush_seconds
        if error is not None:
            raise error

    def close(self) -> None:
        """Flush and close; safe to call twice."""
        if self._closed:
            return
        try:
            self.flush()
            if self.mirror is not None:
                self.mirror.close()
        finally:
            self._closed = True
            for s in self.streams.values():
                s.append = s.extend = s._closed_error  # type: ignore[method-assign]
            self.file.close()
            os.close(self._lock_fd)
            _OPEN_PATHS.discard(self._key)

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"run log {self.path} is closed")

    def __enter__(self) -> RunLog:  # not typing.Self: that needs Python 3.11
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
