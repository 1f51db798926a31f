"""Flat, array-based sum-tree and min-tree over priorities, with vectorized batch operations.

Layout: heap order, root at 1; with ``L = 2**depth >= capacity`` leaves, node ``i`` has children
``2i`` and ``2i+1``, level ``d`` occupies ``[2**d, 2**(d+1))`` and the leaves are ``[L, 2L)``.
Both trees live in ONE ``complex128`` array, ``node[i] = sum_i + 1j * min_i``: one fancy index
gathers or scatters a node's sum and min together (one cache line, one numpy call), which makes
priority propagation about 1.5x faster than two float64 arrays.

Only the levels ``d >= top`` are maintained. The ``T = 2**top`` nodes of level ``top`` are
combined on demand (``cumsum`` for the sampling search, ``min`` for the smallest priority): one
``searchsorted`` replaces ``top`` descent steps, and every propagation stops ``top`` levels early.

* Search, all queries at once (level by level, so the B memory loads of a level are independent
  and overlap; a per-query descent waits for each load in turn):
  ``node = searchsorted(cumsum(level_top), u)``, then per level
  ``right = u >= sum[2i]; u -= sum[2i] * right; i = 2i + right``.
* Propagation of a batch of distinct leaves, level by level, carrying each path's value:
  ``v <- v (+, min) node[i ^ 1]; i >>= 1; node[i] = v``. Every path through a node computes the
  same value (it reads its sibling after the level below was written), so parents shared by
  several paths need no ``np.unique``.
* Contiguous ranges (ring inserts) write the leaves only and are *deferred*: the dirty range is
  propagated with slices at the next read (search, total, min), so many small inserts cost one
  propagation.

Empty leaves are 0 in the sum-tree (never sampled) and +inf in the min-tree (never the minimum).
float64 throughout: with 2**20 leaves a float32 prefix sum resolves only ~2**-24 of the total, so
leaves below ~1e-7 of the mass would be sampled wrongly or not at all.
"""

from __future__ import annotations

import numpy as np

#: Level combined on demand: 2**10 = 1024 nodes; cumsum + searchsorted there cost about as much
#: as two descent steps and replace ten.
TOP_LEVEL = 10
#: Deferred ranges kept before forcing a propagation (inserts at a ring cursor coalesce into one).
MAX_DIRTY = 8


def tree_depth(capacity: int) -> int:
    """Smallest ``depth`` with ``2**depth >= capacity``."""
    return max(0, int(capacity - 1).bit_length())


def tree_bytes(capacity: int) -> int:
    """Bytes of the sum- and min-tree for ``capacity`` leaves: ``2L * 16`` (complex128)."""
    return 2 * (1 << tree_depth(capacity)) * 16


class SumMinTree:
    """Sum-tree and min-tree over ``capacity`` float64 leaves (0 = empty, else > 0)."""

    def __init__(self, capacity: int, top_level: int | None = None) -> None:
        if capacity <= 0:
            raise ValueError(f"sum-tree capacity={capacity} must be > 0")
        self.capacity = int(capacity)
        self.depth = tree_depth(capacity)
        self.n_leaves = n = 1 << self.depth
        self.top = min(self.depth, TOP_LEVEL if top_level is None else int(top_level))
        self.node = np.zeros(2 * n, np.complex128)
        self.sum = self.node.real  # strided views into the same memory
        self.min = self.node.imag
        self.min[:] = np.inf
        self.leaves = self.sum[n : n + self.capacity]  # view: the priorities p_i
        t = 1 << self.top
        self._sum_top = self.sum[t : 2 * t]
        self._min_top = self.min[t : 2 * t]
        self._cs = np.zeros(t + 1, np.float64)
        self._shifts = np.arange(self.depth - self.top + 1, dtype=np.int64)[:, None]
        self._dirty: list[list[int]] = []  # leaf ranges [lo, hi) written but not propagated

    # ---------------------------------------------------------------- queries
    def total(self) -> float:
        """Sum of all leaves, ``sum_i p_i``."""
        if self._dirty:
            self.flush()
        return float(self._sum_top.sum())

    def min_leaf(self) -> float:
        """Smallest non-empty leaf (``inf`` when empty)."""
        if self._dirty:
            self.flush()
        return float(self._min_top.min())

    def find_stratified(self, u: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Stratified search: ``u[j] = j + U_j`` (``U_j`` in [0, 1)) is scaled in place by
        ``total / B``, and each query finds the leaf ``i`` with
        ``prefix(i) <= u < prefix(i) + p_i``. Returns ``(i, p_i)``.

        Sorted queries (as stratified ones are) let ``searchsorted`` reuse its bounds. A query
        that rounding pushes onto an empty leaf (possible only at the right edge of a subtree) is
        moved to the nearest non-empty leaf on its left, the exact answer at that boundary.
        """
        if self._dirty:
            self.flush()
        top = self._sum_top
        t = top.shape[0]
        cs = self._cs
        np.cumsum(top, out=cs[1:])  # cs[k] = exclusive prefix of top node k
        u *= cs[t] / u.shape[0]
        node = np.searchsorted(cs[1:], u, side="right")  # cs[node] <= u exactly
        np.minimum(node, t - 1, out=node)
        u -= cs[node]  # >= 0, and every step below keeps u >= 0
        node += t
        tree = self.sum
        for _ in range(self.depth - self.top):
            node <<= 1
            left = tree[node]
            right = u >= left
            left *= right
            u -= left
            node += right
        p = tree[node]
        node -= self.n_leaves
        bad = p <= 0.0
        if bad.any():
            self._fix_empty(node, bad)
            p = tree[node + self.n_leaves]
        return node, p

    def _fix_empty(self, node: np.ndarray, bad: np.ndarray) -> None:
        """Rare (rounding at a boundary): move queries that ended on an empty leaf leftwards."""
        positive = np.flatnonzero(self.sum[self.n_leaves :] > 0.0)
        if positive.size == 0:
            raise ValueError("sum-tree is empty: add items before sampling")
        for k in np.flatnonzero(bad):
            j = np.searchsorted(positive, node[k], side="right") - 1
            node[k] = positive[max(j, 0)]

    # ---------------------------------------------------------------- updates
    def set(self, idx: np.ndarray, p: np.ndarray) -> None:
        """``p_idx = p`` for a batch of DISTINCT leaves (int64 ``idx``), propagated at once."""
        levels = self.depth - self.top
        # every path's nodes and siblings up front: 4 numpy calls per level instead of 6
        path = (idx + self.n_leaves) >> self._shifts[: levels + 1]
        sibling = path[:levels] ^ 1
        cur = np.empty(idx.shape[0], np.complex128)
        cr, ci = cur.real, cur.imag
        cr[:] = p
        ci[:] = p
        tree = self.node
        tree[path[0]] = cur
        for k in range(levels):
            sib = tree[sibling[k]]  # read after the level below was written
            cr += sib.real
            np.minimum(ci, sib.imag, out=ci)
            tree[path[k + 1]] = cur

    def set_range(self, start: int, p: np.ndarray) -> None:
        """``p_[start:start+len(p)] = p`` (contiguous, no wrap); propagation is deferred."""
        lo = start + self.n_leaves
        hi = lo + p.shape[0]
        self.sum[lo:hi] = p
        self.min[lo:hi] = p
        d = self._dirty
        if d and d[-1][1] == lo:
            d[-1][1] = hi
        elif d and d[-1][0] == hi:
            d[-1][0] = lo
        else:
            d.append([lo, hi])
            if len(d) > MAX_DIRTY:
                self.flush()

    def flush(self) -> None:
        """Propagate the deferred ranges, level by level with slices."""
        s, m = self.sum, self.min
        for lo, hi in self._dirty:
            for _ in range(self.depth - self.top):
                lo >>= 1
                hi = (hi + 1) >> 1
                np.add(s[2 * lo : 2 * hi : 2], s[2 * lo + 1 : 2 * hi : 2], out=s[lo:hi])
                np.minimum(m[2 * lo : 2 * hi : 2], m[2 * lo + 1 : 2 * hi : 2], out=m[lo:hi])
        self._dirty.clear()

    def clear(self) -> None:
        """Every leaf empty: sums 0, minima +inf."""
        self.sum[:] = 0.0
        self.min[:] = np.inf
        self._dirty.clear()
