"""A checkpoint's ``.npz`` arrays read on demand, so --resume restores a replay memory of
gigabytes into the live ring a chunk at a time instead of loading a second copy first.

The ``.npz`` files `mpirl.run.checkpoint` writes (and ``np.savez``) store their ``.npy`` members
uncompressed (ZIP_STORED): a member's data begins after its zip local header (30 bytes, the name,
the extra field) and its ``.npy`` header, and row ``i`` of a C-order array of ``r`` bytes per row
sits at ``data + i * r``.  A read of rows ``[i, j)`` is one seek and one ``readinto``.
"""

from __future__ import annotations

import struct
import zipfile
from collections.abc import Container
from pathlib import Path
from typing import Any

import numpy as np
from numpy.lib import format as npf


class StoredArray:
    """An array of a checkpoint's ``.npz``, read from the file when sliced: ``a[i:j]`` reads rows
    ``i..j-1`` (one seek, one read), so a replay memory of gigabytes is restored into the live
    ring a chunk at a time (`mpirl.replay.memory.copy_rows`) instead of loaded whole first.
    ``np.asarray(a)`` reads all of it.  Members are stored uncompressed (ZIP_STORED), so a row's
    bytes sit at a fixed offset in the file; the file's SHA-256 was checked by `select`."""

    def __init__(self, path: Path, offset: int, dtype: np.dtype, shape: tuple) -> None:
        self.path, self.offset, self.dtype, self.shape = path, offset, dtype, shape
        self.ndim = len(shape)
        self.size = int(np.prod(shape, dtype=np.int64))
        self.nbytes = self.size * dtype.itemsize

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, key: Any) -> np.ndarray:
        if not (isinstance(key, slice) and key.step in (None, 1) and self.ndim):
            return np.asarray(self)[key]
        start, stop, _ = key.indices(self.shape[0])
        out = np.empty((max(0, stop - start), *self.shape[1:]), self.dtype)
        self._read(start, out)
        return out

    def __array__(
        self, dtype: np.typing.DTypeLike | None = None, copy: bool | None = None
    ) -> np.ndarray:
        out = np.empty(self.shape, self.dtype)
        if self.ndim:
            self._read(0, out)
        else:
            self._read_bytes(self.offset, out)
        return out if dtype is None else out.astype(dtype, copy=False)

    def _read(self, row: int, out: np.ndarray) -> None:
        row_bytes = self.nbytes // self.shape[0] if self.shape[0] else 0
        self._read_bytes(self.offset + row * row_bytes, out)

    def _read_bytes(self, at: int, out: np.ndarray) -> None:
        view = out.reshape(-1).view(np.uint8).data
        with open(self.path, "rb") as f:
            f.seek(at)
            got = f.readinto(view)
        if got != out.nbytes:
            raise ValueError(
                f"{self.path}: {out.nbytes} bytes at offset {at} are past the end "
                "of the file (truncated); the checkpoint is corrupt"
            )


def stored_members(path: Path, names: Container[str]) -> dict[str, StoredArray | np.ndarray]:
    """`StoredArray` handles of the members ``names`` (``<name>.npy``) of an uncompressed npz;
    a compressed member, or one in Fortran order, is read whole instead."""
    out: dict[str, StoredArray | np.ndarray] = {}
    with open(path, "rb") as f, zipfile.ZipFile(f) as z:
        for info in z.infolist():
            name = info.filename.removesuffix(".npy")
            if name not in names:
                continue
            if info.compress_type != zipfile.ZIP_STORED:
                with z.open(info) as m:
                    out[name] = npf.read_array(m, allow_pickle=False)
                continue
            f.seek(info.header_offset)
            head = f.read(30)
            if head[:4] != b"PK\x03\x04":
                raise ValueError(f"member {info.filename}: no local file header")
            n_name, n_extra = struct.unpack("<HH", head[26:30])
            f.seek(info.header_offset + 30 + n_name + n_extra)
            version = npf.read_magic(f)
            read_header = (
                npf.read_array_header_1_0 if version == (1, 0) else npf.read_array_header_2_0
            )
            shape, fortran, dtype = read_header(f)
            if dtype.hasobject:
                raise ValueError(f"member {info.filename} holds Python objects (no pickle)")
            if fortran and len(shape) > 1:
                with z.open(info) as m:
                    out[name] = npf.read_array(m, allow_pickle=False)
                continue
            out[name] = StoredArray(path, f.tell(), dtype, tuple(shape))
    return out
