"""Tests of the prioritized replay memory against brute force and a slow pure-Python reference."""

from __future__ import annotations

import io
import math
from unittest import mock

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mpirl.replay import PrioritizedReplay, Sample, footprint_bytes, sumtree
from mpirl.replay.sumtree import SumMinTree

DT = np.dtype(
    [
        ("obs", "<f4", (4,)),
        ("action", "<i8"),
        ("reward", "<f4"),
        ("next_obs", "<f4", (4,)),
        ("done", "u1"),
    ]
)


def records(serials) -> np.ndarray:
    """Records whose content encodes a serial number, to check what a slot holds."""
    serials = np.asarray(serials)
    r = np.zeros(len(serials), DT)
    r["action"] = serials
    r["obs"] = serials[:, None] + np.arange(4)
    r["reward"] = serials * 0.5
    return r


def prio(td, alpha=0.6, eps=1e-6):
    return (np.abs(np.asarray(td, np.float64)) + eps) ** alpha


class Reference:
    """Slow, obviously correct model: Python lists, one slot at a time."""

    def __init__(self, capacity, alpha, beta, eps):
        self.capacity, self.alpha, self.beta, self.eps = capacity, alpha, beta, eps
        self.p = [0.0] * capacity
        self.serial = [-1] * capacity  # serial number of the transition in each slot
        self.n = 0

    def size(self):
        return min(self.n, self.capacity)

    def priority(self, td):
        return (abs(float(td)) + self.eps) ** self.alpha

    def add(self, serials, tds):
        written = []
        for s, td in zip(serials, tds, strict=True):
            slot = self.n % self.capacity
            self.p[slot] = self.priority(td)
            self.serial[slot] = int(s)
            self.n += 1
            written.append(slot)
        return written[-self.capacity :]

    def update(self, idx, gens, tds):
        stale = 0
        for i, g, td in zip(idx, gens, tds, strict=True):
            if self.serial[i] != g:
                stale += 1
            else:
                self.p[i] = self.priority(td)  # in order: the last occurrence wins
        return stale

    def probabilities(self):
        p = np.array(self.p[: self.size()])
        return p / p.sum()

    def weights(self, idx):
        n = self.size()
        prob = self.probabilities()
        w_all = (n * prob) ** -self.beta
        return (n * prob[idx]) ** -self.beta / w_all.max()

    def find(self, u):
        """Leaf holding mass point u, by a linear prefix sum."""
        cs = np.cumsum(self.p[: self.size()])
        return np.minimum(np.searchsorted(cs, u, side="right"), self.size() - 1)


def chi2_critical(df: int, z: float = 4.75) -> float:
    """Chi-square critical value at one-sided p ~ 1e-6 (Wilson-Hilferty approximation)."""
    a = 2.0 / (9.0 * df)
    return df * (1.0 - a + z * math.sqrt(a)) ** 3


def chi2_stat(counts, probs) -> float:
    expected = counts.sum() * probs
    return float(((counts - expected) ** 2 / expected).sum())


@pytest.fixture(params=[1, None], ids=["deep-tree", "default-tree"])
def top(request, monkeypatch):
    """Run a test with a tiny top level too, so that small memories have levels to descend
    and propagate through (with the default, capacities <= 1024 are a single searched level)."""
    if request.param is not None:
        monkeypatch.setattr(sumtree, "TOP_LEVEL", request.param)
    return request.param


# ---------------------------------------------------------------------------------------- basics
def test_api_and_footprint(top):
    m = PrioritizedReplay(100, DT, seed=0)
    assert (m.capacity, m.size, len(m), m.alpha, m.beta, m.eps) == (100, 0, 0, 0.6, 0.4, 1e-6)
    nbytes = m._storage.nbytes + m._tree.node.nbytes + m._scratch.nbytes
    assert footprint_bytes(100, DT) == nbytes == m.footprint
    idx = m.add(records(range(10)), np.arange(10.0))
    assert idx.dtype == np.int64 and idx.tolist() == list(range(10))
    s = m.sample(8)
    assert isinstance(s, Sample)
    assert s.indices.dtype == np.int64 and s.generations.dtype == np.int64
    assert s.weights.dtype == np.float32 and s.priorities.dtype == np.float32
    assert s.records.dtype == DT and s.records.shape == (8,)
    np.testing.assert_array_equal(s.records["action"], s.indices)  # records match slots
    m.beta = 1.0
    assert m.beta == 1.0


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(capacity=0), r"capacity=0 must be > 0"),
        (dict(capacity=-5), r"capacity=-5 must be > 0"),
        (dict(capacity=2.5), r"capacity=2.5 must be an integer"),
        (dict(dtype=np.float32), r"structured dtype"),
        (dict(alpha=-1), r"alpha=-1.0 must be"),
        (dict(eps=0.0), r"eps=0.0 must be finite and > 0"),
        (dict(beta=float("nan")), r"beta=nan must be finite"),
    ],
)
def test_constructor_errors(kwargs, match):
    args = dict(capacity=10, dtype=DT) | kwargs
    with pytest.raises(ValueError, match=match):
        PrioritizedReplay(**args)


def test_memory_refusal_names_capacity_bytes_and_fix():
    need = footprint_bytes(1_000_000, DT)
    with pytest.raises(ValueError) as e:
        PrioritizedReplay(1_000_000, DT, max_bytes=need - 1)
    msg = str(e.value)
    assert "capacity=1000000" in msg and "MiB" in msg and "max_bytes" in msg
    assert "lower the capacity to at most" in msg
    fit = int(msg.split("at most ")[1].split()[0])
    assert footprint_bytes(fit, DT) <= need - 1 < footprint_bytes(fit + 1, DT)
    PrioritizedReplay(fit, DT, max_bytes=need - 1)  # the suggested capacity is accepted
    with pytest.raises(ValueError, match="capacity=10 needs"):
        PrioritizedReplay(10, DT, max_bytes=100)


def test_sample_empty_and_bad_batch():
    m = PrioritizedReplay(10, DT)
    with pytest.raises(ValueError, match="empty"):
        m.sample(4)
    m.add(records([0]), [1.0])
    with pytest.raises(ValueError, match="batch_size=0 must be > 0"):
        m.sample(0)


def test_fewer_items_than_batch_samples_with_replacement(top):
    m = PrioritizedReplay(100, DT, seed=1)
    m.add(records([0, 1, 2]), [1.0, 2.0, 3.0])
    s = m.sample(64)
    assert s.indices.shape == (64,)
    assert set(s.indices.tolist()) == {0, 1, 2}
    np.testing.assert_array_equal(s.records["action"], s.indices)


def test_add_validation():
    m = PrioritizedReplay(10, DT)
    with pytest.raises(ValueError, match="dtype"):
        m.add(np.zeros(3, np.float32), np.ones(3))
    with pytest.raises(ValueError, match=r"td_abs.shape=\(2,\) must be \(3,\)"):
        m.add(records([0, 1, 2]), np.ones(2))
    for bad in (np.nan, np.inf, -np.inf):
        with pytest.raises(ValueError, match=r"add\(\): td_abs has 1 bad value"):
            m.add(records([0, 1, 2]), [1.0, bad, 1.0])
    assert len(m) == 0 and m.total_priority() == 0.0  # nothing was written
    assert m.add(records([]), np.ones(0)).shape == (0,)


def test_zero_and_huge_priorities(top):
    m = PrioritizedReplay(10, DT, alpha=0.6, eps=1e-6, seed=0)
    m.add(records([0, 1]), [0.0, 1e30])
    assert m.min_priority() == pytest.approx(1e-6**0.6)
    assert m.max_priority() == pytest.approx((1e30 + 1e-6) ** 0.6)
    s = m.sample(16)
    assert (s.indices == 1).all()  # the zero-TD item has ~1e-22 of the mass
    np.testing.assert_allclose(s.weights, ((1e30**0.6) / 1e-6**0.6) ** -0.4, rtol=1e-5)
    with pytest.raises(ValueError, match="float32 max|<= 3.4"):
        m.add(records([2]), [1e300])  # (1e300)^0.6 = 1e180 > float32 max
    m2 = PrioritizedReplay(10, DT, alpha=0.0)
    m2.add(records([0, 1, 2]), [0.0, 5.0, 1e30])
    assert m2.total_priority() == 3.0  # alpha = 0: uniform


def test_wrap_around_and_generations(top):
    m = PrioritizedReplay(10, DT)
    assert m.add(records(range(7)), np.ones(7)).tolist() == list(range(7))
    assert m.add(records(range(7, 14)), np.ones(7)).tolist() == [7, 8, 9, 0, 1, 2, 3]
    assert len(m) == 10 and m.inserted == 14
    np.testing.assert_array_equal(m._storage["action"], [10, 11, 12, 13, 4, 5, 6, 7, 8, 9])
    np.testing.assert_array_equal(m._generations(np.arange(10)), m._storage["action"])


def test_chunk_larger_than_capacity_keeps_last_records(top):
    m = PrioritizedReplay(10, DT)
    m.add(records(range(3)), np.ones(3))
    idx = m.add(records(range(3, 28)), np.arange(25.0))  # 25 records into 10 slots
    assert idx.tolist() == [8, 9, 0, 1, 2, 3, 4, 5, 6, 7]  # serials 18..27, slot = serial % 10
    assert m.inserted == 28 and len(m) == 10
    np.testing.assert_array_equal(m._storage["action"][idx], np.arange(18, 28))
    np.testing.assert_allclose(m.priorities()[idx], prio(np.arange(15.0, 25.0)))
    np.testing.assert_array_equal(m._generations(idx), np.arange(18, 28))


def test_update_duplicates_last_wins(top):
    m = PrioritizedReplay(10, DT)
    m.add(records(range(10)), np.ones(10))
    g = m._generations(np.arange(10))
    idx = np.array([3, 5, 3, 3, 5, 7])
    td = np.array([1.0, 2.0, 9.0, 4.0, 6.0, 8.0])
    assert m.update(idx, g[idx], td) == 0
    np.testing.assert_allclose(m.priorities()[[3, 5, 7]], prio([4.0, 6.0, 8.0]))
    assert m.total_priority() == pytest.approx(m.priorities().sum(), rel=1e-12)


def test_update_validation_changes_nothing(top):
    m = PrioritizedReplay(10, DT)
    m.add(records(range(10)), np.ones(10))
    before = m.priorities().copy()
    g = m._generations(np.arange(4))
    with pytest.raises(ValueError, match=r"update\(\) of a batch of 4: td_abs has 1 bad .*nan"):
        m.update(np.arange(4), g, [1.0, np.nan, 1.0, 1.0])
    with pytest.raises(ValueError, match=r"batch of 4: td_abs has 2 bad"):
        m.update(np.arange(4), g, [np.inf, 1.0, -np.inf, 1.0])
    with pytest.raises(ValueError, match=r"slot 10 is outside \[0, 10\)"):
        m.update(np.array([1, 10]), np.array([1, 10]), [1.0, 1.0])
    with pytest.raises(ValueError, match=r"slot -1 is outside"):
        m.update(np.array([-1, 2]), np.array([1, 2]), [1.0, 1.0])
    with pytest.raises(ValueError, match="must be 1-D of one length"):
        m.update(np.arange(4), g[:3], np.ones(4))
    np.testing.assert_array_equal(m.priorities(), before)
    assert m.update(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0)) == 0


def test_generations_many_batches_in_flight(top):
    """Long-haul case: several batches out, overwrites arrive before their priorities do."""
    cap = 64
    m = PrioritizedReplay(cap, DT, seed=3)
    m.add(records(range(cap)), np.ones(cap))
    batches = [m.sample(32) for _ in range(4)]
    m.add(records(range(cap, cap + 20)), np.full(20, 2.0))  # overwrites slots 0..19
    batches.append(m.sample(32))  # sampled after the overwrite: all fresh
    m.add(records(range(cap + 20, cap + 30)), np.full(10, 3.0))  # overwrites slots 20..29
    # priorities come back out of order
    for k in [4, 2, 0, 3, 1]:
        b = batches[k]
        first_overwritten = 20 if k == 4 else 0  # batch 4 already saw the first overwrite
        overwritten = (b.indices >= first_overwritten) & (b.indices < 30)
        expect_stale = int(overwritten.sum())
        before = m.priorities().copy()
        td = np.full(32, 10.0 + k)
        assert m.update(b.indices, b.generations, td) == expect_stale
        after = m.priorities()
        # stale slots keep the priority of the transition that overwrote them
        stale_slots = b.indices[overwritten]
        np.testing.assert_array_equal(after[stale_slots], before[stale_slots])
        np.testing.assert_allclose(after[b.indices[~overwritten]], prio(10.0 + k))
    assert m.total_priority() == pytest.approx(m.priorities().sum(), rel=1e-12)


# ---------------------------------------------------------------------------------- statistics
def test_sampling_frequencies_match_priorities_chi_square(top):
    rng = np.random.default_rng(7)
    n = 40
    m = PrioritizedReplay(64, DT, seed=11)
    td = rng.exponential(1.0, n)
    td[:3] = [0.0, 1e-3, 5.0]  # tiny and large ones
    m.add(records(range(n)), td)
    p = prio(td)
    probs = p / p.sum()
    counts = np.zeros(n)
    for _ in range(400):
        np.add.at(counts, m.sample(128).indices, 1)
    crit = chi2_critical(n - 1)
    assert chi2_stat(counts, probs) < crit
    # the same test rejects wrong distributions: it has power
    assert chi2_stat(counts, np.full(n, 1.0 / n)) > crit
    q = prio(td, alpha=0.8)
    assert chi2_stat(counts, q / q.sum()) > crit


def test_importance_weights_exact_against_brute_force(top):
    rng = np.random.default_rng(5)
    for cap, n, beta in [(8, 5, 0.4), (33, 33, 1.0), (100, 70, 0.7), (1000, 999, 0.4)]:
        m = PrioritizedReplay(cap, DT, beta=beta, seed=int(rng.integers(1 << 30)))
        td = rng.exponential(1.0, n) * rng.choice([1e-3, 1.0, 1e3], n)
        m.add(records(range(n)), td)
        s = m.sample(256)
        p = prio(td)
        probs = p / p.sum()
        w_all = (n * probs) ** -beta
        np.testing.assert_allclose(
            s.weights, (n * probs[s.indices]) ** -beta / w_all.max(), rtol=2e-6
        )
        np.testing.assert_allclose(s.priorities, p[s.indices], rtol=1e-6)
        assert s.weights.max() <= 1.0 + 1e-6
    m.beta = 0.0
    assert (m.sample(16).weights == 1.0).all()


def test_total_precision_many_leaves():
    rng = np.random.default_rng(0)
    cap = 1 << 16
    m = PrioritizedReplay(cap, DT, alpha=1.0)
    td = rng.exponential(1.0, cap) * 10.0 ** rng.integers(-6, 6, cap)
    for k in range(0, cap, 4096):
        m.add(records(range(k, k + 4096)), td[k : k + 4096])
    exact = math.fsum(prio(td, alpha=1.0).tolist())
    assert m.total_priority() == pytest.approx(exact, rel=1e-12)
    assert m.min_priority() == pytest.approx(prio(td, alpha=1.0).min(), rel=1e-12)


def test_tree_overflowing_query_lands_on_last_nonempty_leaf():
    t = SumMinTree(100, top_level=3)
    t.set_range(0, np.arange(1.0, 41.0))  # leaves 40..127 are empty
    idx, p = t.find_stratified(np.array([1.0]))  # u = total: one past the end (rounding case)
    assert idx.tolist() == [39] and p.tolist() == [40.0]
    t.set(np.array([39], np.int64), np.array([0.0]))  # now 39 is empty as well
    idx, p = t.find_stratified(np.array([1.0]))
    assert idx.tolist() == [38] and p.tolist() == [39.0]


def test_stratified_queries_match_reference_search(top):
    rng = np.random.default_rng(1)
    m = PrioritizedReplay(5000, DT, seed=123)
    ref = Reference(5000, 0.6, 0.4, 1e-6)
    td = rng.exponential(1.0, 3000)
    m.add(records(range(3000)), td)
    ref.add(range(3000), td)
    s = m.sample(512)
    u = (np.arange(512) + np.random.default_rng(123).random(512)) * (sum(ref.p) / 512)
    np.testing.assert_array_equal(s.indices, ref.find(u))


# ------------------------------------------------------------------------------- state round-trip
def test_state_dict_round_trip_via_npz(top):
    rng = np.random.default_rng(2)
    m = PrioritizedReplay(50, DT, beta=0.5, seed=9)
    m.add(records(range(70)), rng.random(70))
    s = m.sample(16)
    m.update(s.indices, s.generations, rng.random(16))
    d = m.state_dict()
    assert all(isinstance(v, (np.ndarray, int, float)) for v in d.values())
    buf = io.BytesIO()
    np.savez(buf, **d)
    buf.seek(0)
    loaded = dict(np.load(buf, allow_pickle=False))
    m2 = PrioritizedReplay(50, DT, seed=0)
    m2.load_state_dict(loaded)
    assert (len(m2), m2.inserted, m2.beta) == (50, 70, 0.5)
    assert m2.total_priority() == m.total_priority()
    assert m2.min_priority() == m.min_priority()
    a, b = m.sample(32), m2.sample(32)  # rng state restored too
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x, y)
    with pytest.raises(ValueError, match="capacity=50 differs from this memory's capacity=60"):
        PrioritizedReplay(60, DT).load_state_dict(loaded)
    bad = dict(loaded, priorities=np.zeros(50))
    with pytest.raises(ValueError, match="corrupt"):
        m2.load_state_dict(bad)


# ----------------------------------------------------------------- property test vs. reference
OPS = st.lists(
    st.one_of(
        st.tuples(
            st.just("add"),
            st.integers(0, 45),
            st.lists(st.floats(0, 1e6, allow_subnormal=False), min_size=1, max_size=4),
        ),
        st.tuples(st.just("sample"), st.integers(1, 40), st.integers(0, 2**31)),
        st.tuples(st.just("update"), st.integers(0, 3), st.integers(0, 2**31)),
    ),
    min_size=1,
    max_size=25,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    cap=st.integers(1, 40),
    alpha=st.sampled_from([0.0, 0.6, 1.0]),
    beta=st.sampled_from([0.0, 0.4, 1.0]),
    top=st.sampled_from([0, 1, 3, 10]),
    ops=OPS,
)
def test_random_sequences_match_reference(cap, alpha, beta, top, ops):
    # top < depth exercises the descent and the level-by-level propagation below the top level
    with mock.patch.object(sumtree, "TOP_LEVEL", top):
        m = PrioritizedReplay(cap, DT, alpha=alpha, beta=beta, seed=0)
    ref = Reference(cap, alpha, beta, 1e-6)
    serial = 0
    in_flight: list[Sample] = []
    for op, a, b in ops:
        if op == "add":
            tds = np.resize(np.asarray(b, np.float64), a)
            idx = m.add(records(range(serial, serial + a)), tds)
            assert idx.tolist() == ref.add(range(serial, serial + a), tds)
            serial += a
        elif op == "sample":
            if len(m) == 0:
                with pytest.raises(ValueError):
                    m.sample(a)
                continue
            s = m.sample(a, rng=np.random.default_rng(b))
            n = ref.size()
            assert ((0 <= s.indices) & (s.indices < n)).all()
            assert s.records["action"].tolist() == [ref.serial[i] for i in s.indices]
            assert s.generations.tolist() == [ref.serial[i] for i in s.indices]
            np.testing.assert_allclose(s.priorities, [ref.p[i] for i in s.indices], rtol=1e-6)
            np.testing.assert_allclose(s.weights, ref.weights(s.indices), rtol=1e-5)
            in_flight.append(s)
        elif op == "update" and in_flight:
            s = in_flight.pop(a % len(in_flight))
            tds = np.random.default_rng(b).exponential(1.0, len(s.indices))
            assert m.update(s.indices, s.generations, tds) == ref.update(
                s.indices, s.generations, tds
            )
        assert len(m) == ref.size()
        np.testing.assert_allclose(m.priorities(), ref.p, rtol=1e-12)
        assert m.total_priority() == pytest.approx(sum(ref.p), rel=1e-12, abs=0)
        if ref.size():
            assert m.min_priority() == pytest.approx(min(ref.p[: ref.size()]), rel=1e-12)
            assert m.max_priority() == pytest.approx(max(ref.p[: ref.size()]), rel=1e-12)


def test_max_weight_puts_samples_of_two_memories_on_one_scale():
    """Weights are divided by the memory's max weight (mean p / p_min)^beta; multiplied back
    they are (N P(i))^-beta, which compares transitions of memories with different priority
    scales (the learner's common scale for several buffers)."""
    rng = np.random.default_rng(0)
    assert PrioritizedReplay(8, DT).max_weight() == 1.0  # empty
    figures = []
    for scale in (0.1, 30.0):
        m = PrioritizedReplay(1000, DT, alpha=0.6, beta=0.7, eps=1e-3, seed=1)
        m.add(records(np.arange(1000)), rng.exponential(scale, 1000))
        s = m.sample(64)
        p = m.priorities()[:1000]
        assert m.max_weight() == pytest.approx((p.mean() / p.min()) ** 0.7)
        np.testing.assert_allclose(
            s.weights * m.max_weight(), (s.priorities / p.mean()) ** -0.7, rtol=1e-4
        )
        figures.append(m.max_weight())
    assert figures[1] > 2 * figures[0]  # the two memories' own normalisers differ
