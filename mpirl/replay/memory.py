"""Proportional prioritized replay memory (Schaul et al. 2016) with vectorized batch operations.

Math, for the ``N`` transitions held:

* priority ``p_i = (|delta_i| + eps) ** alpha`` (computed once, when added or updated);
* sampling probability ``P(i) = p_i / sum_k p_k``, drawn *stratified*: the total mass is cut into
  ``B`` equal segments and query ``j`` is ``u_j = (j + U_j) * total / B`` with ``U_j ~ U[0, 1)``;
  the expected count of ``i`` in a batch is ``B P(i)``, as for ``B`` independent draws, with
  lower variance; items are drawn *with replacement* (repeats possible, also when ``N < B``);
* importance weight ``w_i = (N P(i)) ** -beta / max_j (N P(j)) ** -beta = (p_i / p_min) ** -beta``
  with ``p_min`` the smallest priority in the whole memory (min-tree), so ``max w = 1``.

Storage is one preallocated ring ``np.empty(capacity, dtype)`` of a structured dtype (one record =
one transition). A slot's *generation* is the serial number (0, 1, 2, ... in insertion order) of
the transition it holds; it follows from the ring cursor, ``g(s) = (n-1) - ((n-1-s) mod C)`` after
``n`` insertions, so it costs no memory and changes whenever the slot is overwritten. ``update``
drops priorities whose generation no longer matches (the slot was overwritten while the batch was
in flight over the long-haul link).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, NamedTuple, Protocol

import numpy as np

from mpirl.replay.sumtree import SumMinTree, tree_bytes

#: Largest priority accepted: float32 max, so ``Sample.priorities`` (float32) is always finite and
#: the float64 sums over 2**k leaves can never overflow.
P_MAX = float(np.finfo(np.float32).max)


class Sample(NamedTuple):
    """One sampled batch; every array has length ``B`` and is a fresh copy."""

    indices: np.ndarray  #: int64 slots (pass back to ``update``)
    generations: np.ndarray  #: int64 serial numbers of the transitions (pass back to ``update``)
    weights: np.ndarray  #: float32 ``(p_i / p_min) ** -beta``; 1 for the memory's smallest p
    priorities: np.ndarray  #: float32 priorities ``p_i`` the memory held when sampling
    records: np.ndarray  #: the transitions, ``memory.dtype``
    #: image observations (`mpirl.replay.frames.FrameReplay`): the batch's frame table, which
    #: ``records["frames"]`` index; None for vector observations
    frames: np.ndarray | None = None


class Rows(Protocol):
    """An array, or anything whose contiguous slices are arrays
    (`mpirl.run.checkpoint_arrays.StoredArray` reads each slice from its file)."""

    @property
    def shape(self) -> tuple[int, ...]: ...

    def __getitem__(self, key: slice, /) -> np.ndarray: ...


#: Bytes `copy_rows` copies at a time: a restore's only memory beside the ring it fills.
COPY_BYTES = 1 << 22


def copy_rows(dst: np.ndarray, src: Rows) -> None:
    """``dst[:] = src[:len(dst)]``, ``COPY_BYTES`` at a time.  ``src`` is an array or anything
    whose contiguous slices are arrays (`mpirl.run.checkpoint_arrays.StoredArray` reads each slice
    from its file), so filling a ring from a checkpoint needs one chunk, not a second ring."""
    rows, n = max(1, COPY_BYTES // max(1, dst[:1].nbytes)), len(dst)
    for i in range(0, n, rows):
        dst[i : min(i + rows, n)] = src[i : min(i + rows, n)]


def _mb(n: float) -> str:
    return f"{n / 2**20:,.1f} MiB"


def available_memory() -> tuple[int | None, str]:
    """Bytes of memory available now and where the figure comes from (``None`` if unknown)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024, "MemAvailable in /proc/meminfo"
    except OSError:
        pass
    try:
        return (
            os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"),
            "os.sysconf(SC_AVPHYS_PAGES)",
        )
    except (ValueError, OSError, AttributeError):
        return None, "unknown"


def _check_dtype(dtype: np.typing.DTypeLike) -> np.dtype:
    dt = np.dtype(dtype)
    if dt.names is None or dt.itemsize == 0:
        raise ValueError(
            f"replay dtype={dt} must be a numpy structured dtype with one field per "
            "part of a transition, e.g. np.dtype([('obs', '<f4', (4,)), "
            "('action', '<i8'), ...])"
        )
    if dt.hasobject:
        raise ValueError(
            f"replay dtype={dt} holds Python objects; use fixed-size numeric fields "
            "(the ring is a plain preallocated array, saved without pickle)"
        )
    return dt


def _footprint_parts(capacity: int, dt: np.dtype) -> tuple[int, int, int]:
    storage = capacity * dt.itemsize
    trees = tree_bytes(capacity)
    scratch = capacity * 4  # int32 per slot: last-wins de-duplication in update()
    return storage, trees, scratch


def footprint_bytes(capacity: int, dtype: np.dtype) -> int:
    """Bytes a ``PrioritizedReplay(capacity, dtype)`` allocates, known before allocating.

    ``capacity * itemsize`` (ring) + ``2L * 16`` (float64 sum- and min-tree interleaved as
    complex128, ``L = 2**ceil(log2 capacity)``) + ``4 * capacity`` (int32 update scratch).
    Generations are derived from the ring cursor and take no memory.
    """
    if capacity <= 0:
        raise ValueError(f"replay capacity={capacity} must be > 0")
    return sum(_footprint_parts(int(capacity), _check_dtype(dtype)))


def _max_capacity(budget: int, dt: np.dtype) -> int:
    lo, hi = 0, max(1, budget // max(1, dt.itemsize))
    while lo < hi:  # largest capacity whose footprint fits the budget
        mid = (lo + hi + 1) // 2
        if sum(_footprint_parts(mid, dt)) <= budget:
            lo = mid
        else:
            hi = mid - 1
    return lo


class PrioritizedReplay:
    """Proportional prioritized replay over a preallocated ring of structured records.

    Batch operations only: ``add`` a chunk, ``sample`` a batch, ``update`` a batch's priorities.
    Not thread-safe; one process owns one memory.
    """

    def __init__(
        self,
        capacity: int,
        dtype: np.dtype,
        alpha: float = 0.6,
        beta: float = 0.4,
        eps: float = 1e-6,
        seed: int | None = None,
        max_bytes: int | None = None,
    ) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, (int, np.integer)):
            raise ValueError(
                f"replay capacity={capacity!r} must be an integer number of transitions"
            )
        capacity = int(capacity)
        if capacity <= 0:
            raise ValueError(f"replay capacity={capacity} must be > 0")
        if capacity >= 2**31:
            raise ValueError(f"replay capacity={capacity} must be < 2**31")
        dt = _check_dtype(dtype)
        alpha, eps = float(alpha), float(eps)
        if not (np.isfinite(alpha) and alpha >= 0):
            raise ValueError(f"replay alpha={alpha} must be finite and >= 0 (0 = uniform)")
        if not (np.isfinite(eps) and eps > 0):
            raise ValueError(
                f"replay eps={eps} must be finite and > 0 so that every priority "
                "(|td| + eps) ** alpha is positive"
            )
        if not eps**alpha > 0:
            raise ValueError(f"replay eps={eps} ** alpha={alpha} underflows to 0; raise eps")
        storage, trees, scratch = _footprint_parts(capacity, dt)
        need = storage + trees + scratch
        if max_bytes is None:
            avail, source = available_memory()
        else:
            avail, source = int(max_bytes), "max_bytes"
        if avail is not None and need > avail:
            fit = _max_capacity(avail, dt)
            raise ValueError(
                f"replay capacity={capacity} needs {_mb(need)} ({_mb(storage)} ring of "
                f"{dt.itemsize} B/transition + {_mb(trees)} sum/min trees + {_mb(scratch)} "
                f"scratch) but only {_mb(avail)} is available ({source}); lower the capacity to "
                f"at most {fit} transitions, or free memory"
            )
        self._dtype = dt
        self._capacity = capacity
        self._alpha, self._eps = alpha, eps
        self.beta = beta
        self._storage = np.empty(capacity, dt)
        self._void = self._storage.view(np.dtype((np.void, dt.itemsize)))
        self._tree = SumMinTree(capacity)
        self._scratch = np.empty(capacity, np.int32)
        self._n = 0  # transitions ever inserted (serial number of the next one)
        self._rng = np.random.default_rng(seed)
        self._aranges: dict[int, np.ndarray] = {}
        self.footprint = need

    # ------------------------------------------------------------------ properties
    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def dtype(self) -> np.dtype:
        return self._dtype

    @property
    def size(self) -> int:
        """Transitions held, ``min(inserted, capacity)``."""
        return min(self._n, self._capacity)

    def __len__(self) -> int:
        return min(self._n, self._capacity)

    @property
    def inserted(self) -> int:
        """Transitions ever added (the serial number the next one gets)."""
        return self._n

    @property
    def alpha(self) -> float:
        """Priority exponent; fixed at construction (stored priorities already include it)."""
        return self._alpha

    @property
    def eps(self) -> float:
        return self._eps

    @property
    def beta(self) -> float:
        """Importance-sampling exponent; settable, e.g. annealed from 0.4 to 1."""
        return self._beta

    @beta.setter
    def beta(self, value: float) -> None:
        value = float(value)
        if not (np.isfinite(value) and value >= 0):
            raise ValueError(f"replay beta={value} must be finite and >= 0 (1 = full correction)")
        self._beta = value

    def __repr__(self) -> str:
        return (
            f"PrioritizedReplay(size={self.size}, capacity={self._capacity}, "
            f"alpha={self._alpha}, beta={self._beta}, footprint={_mb(self.footprint)})"
        )

    # ------------------------------------------------------------------ helpers
    def _arange(self, n: int) -> np.ndarray:
        """Cached ``np.arange(n, dtype=int32)`` (read-only use)."""
        a = self._aranges.get(n)
        if a is None:
            if len(self._aranges) > 8:
                self._aranges.clear()
            a = self._aranges[n] = np.arange(n, dtype=np.int32)
        return a

    def _priorities(self, td_abs: np.ndarray, where: str) -> np.ndarray:
        """``p = (|td| + eps) ** alpha`` as float64; refuses NaN, inf and p > float32 max."""
        p = np.abs(td_abs, dtype=np.float64)
        p += self._eps
        if self._alpha != 1.0:
            np.power(p, self._alpha, out=p)
        if not p.max() <= P_MAX:  # also catches NaN
            bad = np.flatnonzero(~(p <= P_MAX))
            k = int(bad[0])
            raise ValueError(
                f"{where}: td_abs has {bad.size} bad value(s) in a batch of {p.size}, first "
                f"td_abs[{k}]={td_abs[k]!r} (priority {p[k]!r}); TD errors must be finite and "
                f"give (|td| + eps) ** alpha <= {P_MAX:.3g}: check the loss for NaN/inf or clip "
                "td_abs"
            )
        return p

    def _generations(self, idx: np.ndarray) -> np.ndarray:
        """Serial number of the transition in each slot: ``(n-1) - ((n-1-s) mod C)``."""
        last = self._n - 1
        g = last - idx
        g %= self._capacity
        np.subtract(last, g, out=g)
        return g

    # ------------------------------------------------------------------ add
    def add(self, records: np.ndarray, td_abs: np.ndarray, frames: None = None) -> np.ndarray:
        """Insert a chunk at the ring cursor with ``p = (|td_abs| + eps) ** alpha``.

        Overwrites the oldest transitions once full (their generation changes); of a chunk longer
        than ``capacity`` only the last ``capacity`` records are kept. Returns the slots written,
        in the order of ``records``.  ``frames`` is the image memory's argument
        (`mpirl.replay.frames.FrameReplay.add`), so the roles call both the same way; this memory
        stores vector observations and takes none.
        """
        if frames is not None:
            raise ValueError(
                "add(): frames given to a memory of vector observations; image "
                "observations go to mpirl.replay.frames.FrameReplay"
            )
        if not isinstance(records, np.ndarray) or records.dtype != self._dtype:
            got = records.dtype if isinstance(records, np.ndarray) else type(records).__name__
            raise ValueError(
                f"add(): records dtype {got} is not the memory's dtype "
                f"{self._dtype}; build them with np.empty(n, memory.dtype)"
            )
        if records.ndim != 1:
            raise ValueError(
                f"add(): records.shape={records.shape} must be 1-D (one record per transition)"
            )
        m = records.shape[0]
        td = np.asarray(td_abs)
        if td.shape != (m,):
            raise ValueError(f"add(): td_abs.shape={td.shape} must be ({m},), one per record")
        if m == 0:
            return np.empty(0, np.int64)
        p = self._priorities(td, "add()")
        cap = self._capacity
        skip = max(0, m - cap)
        if skip:
            records, p = records[skip:], p[skip:]
        k = m - skip
        start = (self._n + skip) % cap
        first = min(k, cap - start)
        src = records.view(self._void.dtype)  # raw record copies: ~10x faster than field-wise
        self._void[start : start + first] = src[:first]
        self._tree.set_range(start, p[:first])
        if k > first:
            self._void[: k - first] = src[first:]
            self._tree.set_range(0, p[first:])
        self._n += m
        idx = np.arange(start, start + k, dtype=np.int64)
        if k > first:
            idx[first:] -= cap
        return idx

    # ------------------------------------------------------------------ sample
    def sample(self, batch_size: int, rng: np.random.Generator | None = None) -> Sample:
        """Draw ``batch_size`` transitions, stratified, with probability ``p_i / sum p``.

        With replacement (a transition can appear more than once, in particular when
        ``len(memory) < batch_size``). ``rng`` defaults to the memory's own (``seed``).
        """
        n = self.size
        if n == 0:
            raise ValueError(
                "sample(): the replay memory is empty; add transitions before "
                "sampling (e.g. wait for learning_starts)"
            )
        b = int(batch_size)
        if b <= 0:
            raise ValueError(f"sample(): batch_size={batch_size} must be > 0")
        rng = self._rng if rng is None else rng
        tree = self._tree
        u = rng.random(b)
        u += self._arange(b)
        idx, p = tree.find_stratified(u)
        ratio = p * (1.0 / tree.min_leaf())  # p_i / p_min >= 1
        np.minimum(ratio, P_MAX, out=ratio)  # float32 pow is ~3x faster than float64 here
        weights = ratio.astype(np.float32)
        np.power(weights, np.float32(-self._beta), out=weights)
        # ndarray.take copies whole records; fancy indexing a structured array goes field by
        # field and is ~15x slower
        return Sample(
            idx, self._generations(idx), weights, p.astype(np.float32), self._storage.take(idx)
        )

    # ------------------------------------------------------------------ update
    def update(self, indices: np.ndarray, generations: np.ndarray, td_abs: np.ndarray) -> int:
        """Set ``p = (|td_abs| + eps) ** alpha`` for sampled slots; returns how many were stale.

        A priority is dropped (stale) when its slot's generation differs from the one sampled:
        the transition was overwritten meanwhile, any number of batches may be in flight. Within
        one batch a slot given twice takes the *last* value. NaN/inf ``td_abs`` raise ValueError
        and change nothing.
        """
        idx = np.asarray(indices)
        gen = np.asarray(generations)
        td = np.asarray(td_abs)
        b = idx.shape[0] if idx.ndim == 1 else -1
        if idx.ndim != 1 or gen.shape != (b,) or td.shape != (b,):
            raise ValueError(
                f"update(): indices {idx.shape}, generations {gen.shape} and td_abs "
                f"{td.shape} must be 1-D of one length (pass back a Sample's "
                "indices and generations)"
            )
        if b == 0:
            return 0
        if idx.dtype.kind not in "iu":
            raise ValueError(f"update(): indices dtype {idx.dtype} must be an integer type")
        p = self._priorities(td, f"update() of a batch of {b}")
        lo, hi = int(idx.min()), int(idx.max())
        if lo < 0 or hi >= self._capacity:
            raise ValueError(
                f"update(): slot {lo if lo < 0 else hi} is outside [0, "
                f"{self._capacity}); pass back a Sample's indices unchanged"
            )
        idx = idx.astype(np.int64, copy=False)
        fresh = self._generations(idx) == gen
        stale = b - int(np.count_nonzero(fresh))
        if stale:
            if stale == b:
                return stale
            idx, p = idx[fresh], p[fresh]
        # last occurrence wins, independent of numpy's scatter order: keep position k only if no
        # later position names the same slot (ufunc.at applies every element, in order)
        pos = self._scratch
        ar = self._arange(idx.shape[0])
        pos[idx] = -1
        np.maximum.at(pos, idx, ar)
        keep = pos[idx] == ar
        if not keep.all():
            idx, p = idx[keep], p[keep]
        self._tree.set(idx, p)
        return stale

    # ------------------------------------------------------------------ queries
    def total_priority(self) -> float:
        """``sum_i p_i`` over the memory."""
        return self._tree.total()

    def max_priority(self) -> float:
        """``max_i p_i`` (0 when empty). O(capacity): for logging, not the hot path."""
        n = self.size
        return float(self._tree.leaves[:n].max()) if n else 0.0

    def min_priority(self) -> float:
        """``min_i p_i`` from the min-tree (``inf`` when empty)."""
        return self._tree.min_leaf()

    def max_weight(self) -> float:
        """``(mean p / p_min) ** beta``: the largest importance weight relative to uniform
        sampling, ``max_j (N P(j)) ** -beta`` (1 when empty).  ``Sample.weights`` are divided by
        it; a sample's weights times it are ``(N P(i)) ** -beta``, comparable between memories
        (the learner rescales the batches of several buffers with it)."""
        n = self.size
        if n == 0:
            return 1.0
        return float((self._tree.total() / n / self._tree.min_leaf()) ** self._beta)

    def priorities(self) -> np.ndarray:
        """Read-only view of ``p`` per slot (0 for slots never written)."""
        v = self._tree.leaves.view()
        v.flags.writeable = False
        return v

    # ------------------------------------------------------------------ state
    def _load_priorities(self, p: Rows, size: int) -> None:
        """Leaves ``[0, size)`` from ``p``, checked a chunk at a time, then one propagation."""
        rows = COPY_BYTES // 8
        for i in range(0, size, rows):
            chunk = np.asarray(p[i : i + rows], np.float64)
            if not (np.all(chunk > 0) and np.all(chunk <= P_MAX)):
                raise ValueError(
                    "load_state_dict(): priorities must be in (0, float32 max] for "
                    f"the {size} held transitions; the state is corrupt"
                )
            self._tree.set_range(i, chunk)
            del chunk  # one chunk at a time: not two while the next is read
        for i in range(size, p.shape[0], rows):
            if np.any(np.asarray(p[i : i + rows]) != 0):
                raise ValueError(
                    "load_state_dict(): priorities must be 0 for the "
                    f"{p.shape[0] - size} slots never written; the state is corrupt"
                )
        self._tree.flush()

    def state_dict(self) -> dict[str, Any]:
        """Plain numpy arrays and scalars (np.savez / h5py, no pickle).

        ``storage`` and ``priorities`` are read-only *views* (no copy of a large ring): save them
        before the next ``add``/``update``. ``rng_state`` (uint64[6]) is present for the default
        PCG64 generator.
        """
        storage = self._storage.view()
        storage.flags.writeable = False
        d: dict[str, Any] = {
            "storage": storage,
            "priorities": self.priorities(),
            "inserted": int(self._n),
            "capacity": int(self._capacity),
            "alpha": self._alpha,
            "beta": self._beta,
            "eps": self._eps,
        }
        st = self._rng.bit_generator.state
        if st.get("bit_generator") == "PCG64":
            m64 = (1 << 64) - 1
            s, inc = st["state"]["state"], st["state"]["inc"]
            d["rng_state"] = np.array(
                [s >> 64, s & m64, inc >> 64, inc & m64, st["has_uint32"], st["uinteger"]],
                np.uint64,
            )
        return d

    def load_state_dict(self, d: Mapping[str, Any]) -> None:
        """Restore from ``state_dict()`` output, or from a checkpoint's held slots only
        (``storage`` and ``priorities`` of ``min(inserted, capacity)`` entries); the trees are
        rebuilt.  The arrays are copied ``COPY_BYTES`` at a time (`copy_rows`), so they may be
        read from disk as they are copied; a state found corrupt leaves the memory empty."""
        for key in ("storage", "priorities", "inserted", "capacity", "alpha", "beta", "eps"):
            if key not in d:
                raise ValueError(
                    f"load_state_dict(): key {key!r} missing; pass a PrioritizedReplay.state_dict()"
                )
        cap = int(d["capacity"])
        if cap != self._capacity:
            raise ValueError(
                f"load_state_dict(): state capacity={cap} differs from this "
                f"memory's capacity={self._capacity}; construct it with "
                f"capacity={cap}"
            )
        storage, p = (
            x if hasattr(x, "shape") else np.asarray(x) for x in (d["storage"], d["priorities"])
        )
        n = int(d["inserted"])
        size = min(n, cap)
        if storage.dtype != self._dtype or storage.shape not in ((cap,), (size,)):
            raise ValueError(
                f"load_state_dict(): storage {storage.dtype} {storage.shape} differs "
                f"from this memory's {self._dtype} ({cap},); construct it with the "
                "same dtype"
            )
        if p.shape not in ((cap,), (size,)) or n < 0:
            raise ValueError(
                f"load_state_dict(): priorities {p.shape} / inserted={n} are not ({cap},) / >= 0"
            )
        alpha, eps = float(d["alpha"]), float(d["eps"])
        if not (np.isfinite(alpha) and alpha >= 0 and np.isfinite(eps) and eps > 0):
            raise ValueError(f"load_state_dict(): alpha={alpha}, eps={eps} are invalid")
        self._n = 0
        self._tree.clear()
        try:
            copy_rows(self._storage[:size], storage)
            self._load_priorities(p, size)
        except BaseException:
            self._tree.clear()
            raise
        self.beta = float(d["beta"])
        self._alpha, self._eps = alpha, eps
        self._n = n
        if "rng_state" in d and self._rng.bit_generator.state.get("bit_generator") == "PCG64":
            r = [int(x) for x in np.asarray(d["rng_state"], np.uint64)]
            self._rng.bit_generator.state = {
                "bit_generator": "PCG64",
                "state": {"state": (r[0] << 64) | r[1], "inc": (r[2] << 64) | r[3]},
                "has_uint32": r[4],
                "uinteger": r[5],
            }
