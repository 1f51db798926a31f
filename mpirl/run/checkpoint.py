"""Coordinated checkpoints: what each rank saves, how a checkpoint stays atomic, how --resume
finds and checks one.  Pure file handling (no MPI); the protocol lives in the role loops.

Layout of ``RUN_DIR/checkpoint/``::

    000007/                  one folder per checkpoint id
        learner.pt           torch tensors only: online and target networks, Adam state,
                             torch RNG (torch.save of state dicts; read with
                             torch.load(weights_only=True))
        learner.npz          numpy arrays, no pickle: the replay memory (--replay-at learner)
        learner.json         the part's counters and RNG states, its files' sizes and SHA-256
        buffer-<s>.npz/.json the replay memory (--replay-at buffer) or the forward queue; counters
        actor-<r>.npz/.json  transitions not yet sent; counters, epsilons, RNG state
    manifest-000007.json     written last, by the learner: id, config, world size, layout,
                             counters, and every part with its files' sizes and hashes

Atomicity: every file is written under a ``.tmp`` name, fsynced, then ``os.replace``d; a part's
``.json`` is renamed after its data files, and the manifest after every part.  A checkpoint
exists only once its manifest does, so a kill at any moment leaves the previous manifest pointing
at complete files.  The newest ``KEEP`` manifests (and their folders) are kept; older ones and
folders of interrupted attempts are removed after each new manifest.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time
import zipfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, NamedTuple

import numpy as np
from numpy.lib import format as npf

from mpirl.run.checkpoint_arrays import stored_members
from mpirl.run.config import ConfigError

if TYPE_CHECKING:
    from typing_extensions import Buffer

    from mpirl.logs.runlog import RunLog
    from mpirl.replay.frames import FrameReplay
    from mpirl.replay.memory import PrioritizedReplay
    from mpirl.run.failure import Fault

FORMAT = 1
KEEP = 2
DIRNAME = "checkpoint"
_MANIFEST = re.compile(r"^manifest-(\d{6,})\.json$")
_FOLDER = re.compile(r"^(\d{6,})$")


class CheckpointError(ConfigError):
    """A checkpoint that is missing, corrupt, or does not fit this job; the text says the fix."""


#: Arrays of a part whose names start with this (the replay memory's, `memory_state`) are not
#: loaded by `load_part`: they come as `StoredArray`s, read from the file a chunk at a time
#: straight into the live memory by `restore_memory`.
READ_ON_DEMAND = "replay_"


class Part(NamedTuple):
    """One rank's share of a checkpoint, as loaded for --resume."""

    id: int
    meta: dict
    arrays: dict  # name -> np.ndarray, or StoredArray for READ_ON_DEMAND names (empty: no .npz)
    torch: dict | None  # the learner's tensors, else None


def root(run_dir: str | Path) -> Path:
    return Path(run_dir) / DIRNAME


def part_name(role: str, site: int, rank: int) -> str:
    """The same names as the HDF5 files: learner (the lead), learner-<rank> (the other learners
    of a group), buffer-<site>, actor-<rank>."""
    if role == "learner":
        return "learner" if rank == 0 else f"learner-{rank}"
    return {"buffer": f"buffer-{site}", "actor": f"actor-{rank}"}[role]


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def params_sha256(state_dict: Mapping[str, Any]) -> str:
    """SHA-256 of a torch state dict's tensors (names, dtypes, shapes and bytes, in order): the
    learner records it at save and after loading, so a resume that did not carry the networks
    over shows as two different hashes."""
    h = hashlib.sha256()
    for k, v in state_dict.items():
        a = v.detach().cpu().contiguous().numpy()
        h.update(f"{k}:{a.dtype}:{a.shape};".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _write_tmp(path: Path, write: Callable[[IO[bytes]], object]) -> Path:
    """``write(fileobj)`` into ``path.tmp``, fsync it; returns the temp path (not yet renamed)."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())
    return tmp


class _HashingWriter:
    """Write-only stream into a file that takes the SHA-256 of what passes through it, so a
    part's checksum costs no second pass over a file of the replay memory's size.  It has no
    ``seek``: zipfile then streams each member (sizes in a data descriptor after the data)
    instead of seeking back to patch the member's header, so the hash is the file's."""

    def __init__(self, f: IO[bytes]) -> None:
        self.f, self.sha, self.nbytes = f, hashlib.sha256(), 0

    def write(self, data: Buffer) -> int:
        self.sha.update(data)
        self.nbytes += memoryview(data).nbytes
        return self.f.write(data)

    def tell(self) -> int:
        return self.nbytes

    def flush(self) -> None:
        self.f.flush()


def _write_tmp_hashed(path: Path, write: Callable[[Any], object]) -> tuple[Path, dict]:
    """`_write_tmp` through a `_HashingWriter` (write-only, so not quite an ``IO[bytes]``):
    (temp path, {"bytes", "sha256"})."""
    out: dict[str, Any] = {}

    def hashed(f: IO[bytes]) -> None:
        w = _HashingWriter(f)
        write(w)
        out.update(bytes=w.nbytes, sha256=w.sha.hexdigest())

    return _write_tmp(path, hashed), out


#: Bytes of an array a checkpoint holds in memory at a time while writing it: the replay memory
#: is written from views of the ring, in chunks (a copy of a chunk only where a view is strided).
CHUNK_BYTES = 1 << 22


def _write_npy(out: IO[bytes], a: np.ndarray) -> None:
    """One array in .npy format (C order), from a view, ``CHUNK_BYTES`` at a time."""
    if a.dtype.hasobject:
        raise ValueError(f"checkpoint arrays hold numbers only (no pickle), not {a.dtype}")
    header = {"descr": npf.dtype_to_descr(a.dtype), "fortran_order": False, "shape": a.shape}
    try:
        npf.write_array_header_1_0(out, header)
    except ValueError:  # a header over 64 KiB
        npf.write_array_header_2_0(out, header)
    if a.ndim == 0 or a.size == 0:
        out.write(np.ascontiguousarray(a).tobytes())
        return
    rows = max(1, CHUNK_BYTES // max(1, a[:1].nbytes))
    for i in range(0, a.shape[0], rows):
        out.write(np.ascontiguousarray(a[i : i + rows]).reshape(-1).view(np.uint8).data)


def _write_npz(f: IO[bytes], arrays: Mapping[str, np.ndarray]) -> None:
    """What ``np.savez(f, **arrays)`` writes (a zip of .npy members, read with ``np.load``),
    without copying the arrays first: ``arrays`` may be views of a ring of gigabytes."""
    with zipfile.ZipFile(f, mode="w", compression=zipfile.ZIP_STORED, allowZip64=True) as z:
        for name, a in arrays.items():
            with z.open(f"{name}.npy", "w", force_zip64=True) as out:
                _write_npy(out, np.asanyarray(a))


#: Slowest rate (bytes/s) at which a healthy rank writes and hashes its checkpoint part: the
#: time limits on a checkpoint grow by ``nbytes / MIN_WRITE_BYTES_PER_S`` for a part of nbytes.
MIN_WRITE_BYTES_PER_S = 25e6


def write_allowance_s(nbytes: int) -> float:
    """Seconds a checkpoint part of ``nbytes`` may take on top of a fixed time limit."""
    return nbytes / MIN_WRITE_BYTES_PER_S


def _json_bytes(obj: Any) -> bytes:
    return (json.dumps(obj, indent=1, sort_keys=True) + "\n").encode()


def ids(run_dir: str | Path) -> tuple[list[int], list[int]]:
    """(manifest ids, folder ids), each ascending."""
    r = root(run_dir)
    if not r.is_dir():
        return [], []
    man, folders = [], []
    for p in r.iterdir():
        if m := _MANIFEST.match(p.name):
            man.append(int(m.group(1)))
        elif (m := _FOLDER.match(p.name)) and p.is_dir():
            folders.append(int(m.group(1)))
    return sorted(man), sorted(folders)


def next_id(run_dir: str | Path) -> int:
    """An id never used in this run folder (also not by an interrupted attempt)."""
    man, folders = ids(run_dir)
    return max([0, *man, *folders]) + 1


def write_part(
    run_dir: str | Path,
    ckpt_id: int,
    name: str,
    meta: dict,
    arrays: dict | None = None,
    torch_state: dict | None = None,
    before_rename: Callable[[], object] | None = None,
) -> dict:
    """Write one rank's part of checkpoint ``ckpt_id`` atomically; returns its description.

    ``before_rename``: test hook called after the temp files are written, before any rename
    (fault injection: a kill there must leave the previous checkpoint usable).
    """
    d = root(run_dir) / f"{ckpt_id:06d}"
    d.mkdir(parents=True, exist_ok=True)
    tmps: list[tuple[Path, dict, Path]] = []
    if arrays:
        final = d / f"{name}.npz"
        tmps.append((*_write_tmp_hashed(final, lambda f: _write_npz(f, arrays)), final))
    if torch_state is not None:
        import torch

        final = d / f"{name}.pt"
        tmps.append((*_write_tmp_hashed(final, lambda f: torch.save(torch_state, f)), final))
    if before_rename is not None:
        before_rename()
    files = {}
    for tmp, desc, final in tmps:
        files[final.name] = desc
        os.replace(tmp, final)
    part = {
        "format": FORMAT,
        "id": ckpt_id,
        "name": name,
        "files": files,
        "meta": meta,
        "written_unix": time.time(),
    }
    final = d / f"{name}.json"
    os.replace(_write_tmp(final, lambda f: f.write(_json_bytes(part))), final)
    _fsync_dir(d)
    return part


def write_manifest(run_dir: str | Path, ckpt_id: int, names: list[str], info: dict) -> Path:
    """The learner, once every part is on disk: collect the parts, write the manifest last,
    then remove what is older than the newest ``KEEP`` checkpoints."""
    r = root(run_dir)
    d = r / f"{ckpt_id:06d}"
    parts = {}
    for name in names:
        p = d / f"{name}.json"
        try:
            part = json.loads(p.read_text())
        except (OSError, ValueError) as e:
            raise RuntimeError(
                f"checkpoint {ckpt_id}: part {p} unreadable after its rank "
                f"acknowledged it ({e}); is RUN_DIR on a file system every rank "
                "sees?"
            ) from None
        if part.get("id") != ckpt_id:
            raise RuntimeError(f"checkpoint {ckpt_id}: {p} belongs to checkpoint {part.get('id')}")
        parts[name] = part
    manifest = {
        "format": FORMAT,
        "id": ckpt_id,
        "created_unix": time.time(),
        **info,
        "parts": parts,
    }
    final = r / f"manifest-{ckpt_id:06d}.json"
    os.replace(_write_tmp(final, lambda f: f.write(_json_bytes(manifest))), final)
    _fsync_dir(r)
    prune(run_dir)
    return final


def prune(run_dir: str | Path, keep: int = KEEP) -> None:
    """Keep the newest ``keep`` manifests and their folders; remove the rest (older manifests
    first, so a manifest never points at removed files) and any stray temp files."""
    r = root(run_dir)
    man, folders = ids(run_dir)
    kept = set(man[-keep:])
    for i in man:
        if i not in kept:
            (r / f"manifest-{i:06d}.json").unlink(missing_ok=True)
    newest = max(man, default=0)
    for i in folders:
        if i not in kept and i < newest:  # older, or an interrupted attempt before the newest
            shutil.rmtree(r / f"{i:06d}", ignore_errors=True)
    for p in r.glob("*.tmp"):
        p.unlink(missing_ok=True)


def _check(run_dir: Path, manifest: dict, expect_id: int) -> None:
    if manifest.get("format") != FORMAT:
        raise ValueError(f"format {manifest.get('format')!r}, this mpirl reads format {FORMAT}")
    if manifest.get("id") != expect_id:
        raise ValueError(f"says it is checkpoint {manifest.get('id')!r}")
    for key in ("config", "world_size", "layout", "parts"):
        if key not in manifest:
            raise ValueError(f"has no {key!r}")
    d = root(run_dir) / f"{expect_id:06d}"
    for part in manifest["parts"].values():
        for fname, want in part.get("files", {}).items():
            p = d / fname
            if not p.is_file():
                raise ValueError(f"{p} is missing")
            if p.stat().st_size != want["bytes"]:
                raise ValueError(
                    f"{p} has {p.stat().st_size} bytes, the manifest says "
                    f"{want['bytes']} (truncated or overwritten)"
                )
            if _sha256(p) != want["sha256"]:
                raise ValueError(f"{p} does not match its SHA-256 in the manifest (corrupt)")


def select(run_dir: str | Path) -> tuple[dict, list[str]]:
    """The newest checkpoint whose files all check out, and why newer ones were skipped.

    CheckpointError when there is none.  Reads every file once (sizes and SHA-256).
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise CheckpointError(f"--resume {str(run_dir)!r}: no such run folder")
    man, _ = ids(run_dir)
    if not man:
        raise CheckpointError(
            f"--resume {str(run_dir)!r}: the run has no complete checkpoint (no "
            f"{DIRNAME}/manifest-*.json); it stopped before its first one. Start a new run "
            "(--run-dir NEW); a run writes one every --checkpoint-seconds and when it stops "
            "cleanly"
        )
    skipped = []
    for i in reversed(man):
        p = root(run_dir) / f"manifest-{i:06d}.json"
        try:
            m = json.loads(p.read_text())
            if not isinstance(m, dict):
                raise ValueError("is not a JSON object")
            _check(run_dir, m, i)
        except (OSError, ValueError, KeyError, TypeError) as e:
            skipped.append(f"checkpoint {i} ({p.name}) {e}")
            continue
        return m, skipped
    raise CheckpointError(
        f"--resume {str(run_dir)!r}: no usable checkpoint: "
        + "; ".join(skipped)
        + ". The run cannot be resumed; start a new "
        "run (--run-dir NEW)"
    )


def learner_tensors(run_dir: str | Path, ckpt_id: int | None = None) -> tuple[int, dict]:
    """(id, the learner's tensors) of checkpoint ``ckpt_id`` (None: the newest whose learner.pt
    checks out), for playing or exporting a policy.  Only learner.pt is read and checked (its
    size and SHA-256 in the manifest): other parts, replay memories included, are not touched."""
    run_dir = Path(run_dir)
    man, _ = ids(run_dir)
    if ckpt_id is not None and ckpt_id not in man:
        raise CheckpointError(
            f"checkpoint {ckpt_id} is not in {root(run_dir)} (complete ones: "
            f"{', '.join(map(str, man)) or 'none'})"
        )
    if not man:
        raise CheckpointError(f"{run_dir} has no complete checkpoint ({DIRNAME}/manifest-*.json)")
    why = []
    for i in [ckpt_id] if ckpt_id is not None else reversed(man):
        try:
            m = json.loads((root(run_dir) / f"manifest-{i:06d}.json").read_text())
            want = m["parts"]["learner"]["files"]["learner.pt"]
            p = root(run_dir) / f"{i:06d}" / "learner.pt"
            if p.stat().st_size != want["bytes"] or _sha256(p) != want["sha256"]:
                raise ValueError(f"{p} does not match the manifest (truncated or corrupt)")
            import torch

            return i, torch.load(p, weights_only=True, map_location="cpu")
        except Exception as e:  # noqa: BLE001 - any failure to read is an unusable checkpoint
            why.append(f"checkpoint {i}: {type(e).__name__}: {e}")
    raise CheckpointError(f"{run_dir}: no usable learner part: " + "; ".join(why))


def load_part(run_dir: str | Path, manifest: dict, name: str) -> Part:
    """This rank's part of ``manifest`` (already checked by `select`), without pickle; the
    replay memory's arrays (``READ_ON_DEMAND``) as `StoredArray` handles into the file."""
    ckpt_id = int(manifest["id"])
    part = manifest["parts"].get(name)
    if part is None:
        raise CheckpointError(
            f"checkpoint {ckpt_id} has no part for {name} (parts: "
            f"{', '.join(sorted(manifest['parts']))}); resume with the same "
            "world size and --buffers as the run"
        )
    d = root(run_dir) / f"{ckpt_id:06d}"
    arrays, tensors = {}, None
    try:
        if f"{name}.npz" in part["files"]:
            with np.load(d / f"{name}.npz", allow_pickle=False) as z:
                arrays = {k: z[k] for k in z.files if not k.startswith(READ_ON_DEMAND)}
                later = {k for k in z.files if k.startswith(READ_ON_DEMAND)}
            arrays.update(stored_members(d / f"{name}.npz", later))
        if f"{name}.pt" in part["files"]:
            import torch

            tensors = torch.load(d / f"{name}.pt", weights_only=True, map_location="cpu")
    except Exception as e:  # noqa: BLE001 - any failure to read is a corrupt checkpoint
        raise CheckpointError(
            f"checkpoint {ckpt_id}: {name}'s files cannot be read "
            f"({type(e).__name__}: {e}); the checkpoint is corrupt"
        ) from None
    return Part(ckpt_id, part["meta"], arrays, tensors)


def log_rows(log: RunLog) -> dict[str, int]:
    """Rows appended so far to each stream of a RunLog (written or still buffered; rows a
    writer holds back until the log's next flush, as the learner's `HeldRows`, are not in it:
    `Checkpointer.write` flushes the log first)."""
    return {name: s.rows_written + s.rows_pending for name, s in log.streams.items()}


def file_rows(h5file: Any) -> dict[str, int]:
    """Rows on disk per stream of an open run log (an h5py.File; shortest field)."""
    out = {}
    for name, g in h5file.items():
        lengths = [d.shape[0] for d in g.values() if hasattr(d, "shape")]
        out[name] = min(lengths, default=0)
    return out


# ---- the replay memory ------------------------------------------------------------------------


def memory_state(
    memory: PrioritizedReplay | FrameReplay, prefix: str = "replay_"
) -> tuple[dict, dict]:
    """(arrays, meta) of a PrioritizedReplay: only the slots in use (the ring starts at 0).

    A FrameReplay (image observations) saves its own way: the slots and frames in use, the frame
    ring's cursor and the retired tail (`FrameReplay.checkpoint_state`)."""
    if hasattr(memory, "checkpoint_state"):
        return memory.checkpoint_state(prefix)
    sd = memory.state_dict()
    n = len(memory)
    # views of the ring (write them before the memory changes): a copy would double its memory
    arrays = {f"{prefix}storage": sd["storage"][:n], f"{prefix}priorities": sd["priorities"][:n]}
    if "rng_state" in sd:
        arrays[f"{prefix}rng_state"] = sd["rng_state"]
    meta = {k: sd[k] for k in ("inserted", "capacity", "alpha", "beta", "eps")}
    return arrays, meta


def restore_memory(
    memory: PrioritizedReplay | FrameReplay, arrays: dict, meta: dict, prefix: str = "replay_"
) -> None:
    """Load what `memory_state` saved into a memory built with the run's config.  The arrays
    (numpy arrays, or `StoredArray`s from `load_part`) are copied into the memory's own a chunk
    at a time: a restore takes the memory plus one chunk (tests/test_checkpoint_memory.py)."""
    if hasattr(memory, "restore_checkpoint"):
        try:
            memory.restore_checkpoint(arrays, meta, prefix)
        except (ValueError, KeyError) as e:
            raise CheckpointError(f"replay memory in the checkpoint: {e}") from None
        return
    cap = int(meta["capacity"])
    if cap != memory.capacity:
        raise CheckpointError(
            f"replay memory of {cap:,} transitions in the checkpoint, "
            f"{memory.capacity:,} configured"
        )
    stored = arrays[f"{prefix}storage"]
    prios = arrays[f"{prefix}priorities"]
    n = min(int(meta["inserted"]), cap)
    if stored.shape != (n,) or prios.shape != (n,) or stored.dtype != memory.dtype:
        raise CheckpointError(
            f"replay memory in the checkpoint is {stored.dtype} "
            f"{stored.shape} with priorities {prios.shape}; expected "
            f"{memory.dtype} ({n},)"
        )
    d = {"storage": stored, "priorities": prios, **meta}  # the held slots only: [0, n)
    try:
        if f"{prefix}rng_state" in arrays:
            d["rng_state"] = np.asarray(arrays[f"{prefix}rng_state"])
        memory.load_state_dict(d)
    except ValueError as e:
        raise CheckpointError(f"replay memory in the checkpoint: {e}") from None


def rng_meta(rng: np.random.Generator) -> Mapping[str, Any]:
    """A numpy Generator's state as JSON-able data (Python ints keep all 128 bits)."""
    return rng.bit_generator.state


def restore_rng(rng: np.random.Generator, state: dict) -> None:
    rng.bit_generator.state = state


class Checkpointer:
    """One rank's handle: where its parts go, the fault hook, and (learner) the manifest info."""

    def __init__(
        self,
        run_dir: str | Path,
        name: str,
        fault: Fault | None = None,
        info: dict | None = None,
        log: RunLog | None = None,
    ) -> None:
        self.run_dir, self.name, self.fault, self.info = Path(run_dir), name, fault, info or {}
        self.log = log  # the rank's RunLog: flushed, its row counts go into every part
        self.seconds = 0.0  # time spent writing parts, for the logs

    def write(
        self, ckpt_id: int, meta: dict, arrays: dict | None = None, torch_state: dict | None = None
    ) -> dict:
        t0 = time.monotonic()
        hook = self.fault.in_checkpoint if self.fault is not None else None
        if self.log is not None:
            # held rows (the learner's HeldRows) are handed over and every row goes to disk
            # first: the counts cover every row appended before the part, and a kill after it
            # loses none of them
            self.log.flush()
            meta = {**meta, "log_rows": log_rows(self.log)}
        part = write_part(self.run_dir, ckpt_id, self.name, meta, arrays, torch_state, hook)
        self.seconds += time.monotonic() - t0
        return part

    def manifest(self, ckpt_id: int, names: list[str], reason: str, counters: dict) -> Path:
        return write_manifest(
            self.run_dir, ckpt_id, names, {**self.info, "reason": reason, "counters": counters}
        )

    def next_id(self) -> int:
        return next_id(self.run_dir)
