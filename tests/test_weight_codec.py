"""The weight encodings (mpirl.transport.weight_codec) and the learner's broadcast policy
(mpirl.transport.weight_sync), without MPI: round trips, error bounds, keyframes, the wire."""

import math

import numpy as np
import pytest

from mpirl.transport import weight_codec as wc
from mpirl.transport.link import PIECE, LinkEnd, LinkProfile
from mpirl.transport.wire import Tag, Wire


def _walk(n=5000, steps=30, seed=0):
    """Weights that drift like a learner's: small steps, a few large entries."""
    rng = np.random.default_rng(seed)
    w = rng.normal(0, 0.1, n).astype(np.float32)
    for _ in range(steps):
        w = (w + rng.normal(0, 1e-3, n)).astype(np.float32)
        yield w


def test_bf16_round_trip_error():
    w = np.random.default_rng(1).normal(0, 1, 10_000).astype(np.float32)
    back = wc.from_bf16(wc.to_bf16(w))
    assert back.dtype == np.float32
    assert np.all(np.abs(back - w) <= np.abs(w) * 2.0**-8)  # 8 bits of mantissa, rounded
    assert np.array_equal(wc.from_bf16(wc.to_bf16(back)), back)  # exact on bf16 values


def test_delta_error_bound_and_no_accumulation():
    """One delta is within half a step of its block; error feedback keeps the receiver within
    one step's error after any number of deltas."""
    base = recv = np.zeros(5000, np.float32)
    for w in _walk():
        scales, q, rebuilt = wc.encode_delta(w, base)
        recv = wc.apply_delta(recv, scales, q)
        assert np.array_equal(recv, rebuilt)  # bit-identical on both sides
        bound = np.repeat(scales, wc.BLOCK)[: w.size] / 2 + 1e-7
        assert np.all(np.abs(rebuilt - w) <= bound)
        base = rebuilt
    assert np.abs(recv - w).max() < 1e-3  # the last step's error, not thirty


def test_quantize_zero_and_ragged_blocks():
    d = np.zeros(wc.BLOCK + 3, np.float32)
    d[-1] = 0.5
    scales, q = wc.quantize(d)
    assert scales.shape == (2,) and scales[0] == 0 and q[-1] == 127
    assert np.allclose(wc.dequantize(scales, q), d, atol=0.5 / 254)


def test_keyframe_schedule():
    k = wc.KeyframeSchedule(4)
    assert k.key_due(have_base=False)
    k.sent(True)
    pattern = []
    for _ in range(8):
        key = k.key_due(have_base=True)
        pattern.append(key)
        k.sent(key)
    assert pattern == [False, False, False, True, False, False, False, True]
    k.requested = True
    assert k.key_due(have_base=True)
    k.sent(True)
    assert not k.requested


def test_cache_checks_base_and_checksum():
    wire = Wire(np.dtype([("x", "<f4")]), 5000)
    w0, w1 = list(_walk(steps=2))
    cache = wc.WeightCache()
    m = wire.unpack(wire.weights(w0, 0, 10), Tag.WEIGHTS)
    assert cache.apply(m.count, m.seq, int(m.a), m.arrays) and cache.updates == 10
    scales, q, rebuilt = wc.encode_delta(w1, w0)
    good = wire.unpack(wire.weights_delta(scales, q, 0, wc.checksum(rebuilt), 1, 20), Tag.WEIGHTS)
    assert good.raw_nbytes  # compressed on the wire
    bad_crc = wire.unpack(
        wire.weights_delta(scales, q, 0, wc.checksum(rebuilt) ^ 1, 1, 20), Tag.WEIGHTS
    )
    wrong_base = wire.unpack(
        wire.weights_delta(scales, q, 7, wc.checksum(rebuilt), 1, 20), Tag.WEIGHTS
    )
    assert not cache.apply(bad_crc.count, bad_crc.seq, int(bad_crc.a), bad_crc.arrays)
    assert not cache.apply(wrong_base.count, wrong_base.seq, int(wrong_base.a), wrong_base.arrays)
    assert cache.version == 0  # unchanged
    assert cache.apply(good.count, good.seq, int(good.a), good.arrays)
    assert cache.version == 1 and np.array_equal(cache.params, rebuilt)
    h = wire.unpack(wire.weights_bf16(wc.to_bf16(w1), 2, 30), Tag.WEIGHTS)
    assert cache.apply(h.count, h.seq, int(h.a), h.arrays) and cache.params.dtype == np.float32


class _Comm:
    def __init__(self):
        self.sent = []

    def Isend(self, spec, dest, tag):
        self.sent.append((tag, np.array(spec[0])))

        class _Done:
            def Test(self):
                return True

        return _Done()

    def Improbe(self, source, tag, status):
        """The site has received (and acknowledges) every piece sent so far."""
        k = sum(t >= PIECE for t, _ in self.sent)

        class _Ack:
            def Recv(self, spec):
                spec[0][0] = k

        return _Ack()


class _Site:
    def __init__(self, comm, rate_bps):
        self.link, self.done = LinkEnd(comm, 1, LinkProfile(rate_bps=rate_bps)), False


def _sync(cfg, wire, sites: dict):
    """The learner's WeightSync over these sites' links (a site's ``done`` stops its posts)."""
    from mpirl.transport.weight_sync import WeightSync

    return WeightSync(cfg, wire, {r: s.link for r, s in sites.items()}, lambda r: sites[r].done)


class _Cfg:
    weights_link_share = 0.25
    weights_keyframe_every = 3

    def __init__(self, every="auto", encoding="delta"):
        self.weights_every, self.weights_encoding = every, encoding

    def weights_every_fixed(self):
        return None if self.weights_every == "auto" else int(self.weights_every)


def test_sync_delta_keyframes_and_receiver_follows():
    """The learner's encodings, decoded by a site's cache, give every version within one
    step's error; a keyframe every 3 broadcasts; a request makes the next one a keyframe."""

    n, comm = 5000, _Comm()
    wire = Wire(np.dtype([("x", "<f4")]), n)
    sync = _sync(_Cfg(every="1"), wire, {1: _Site(comm, math.inf)})
    cache, t = wc.WeightCache(), 0.0
    for v, w in enumerate(_walk(n, steps=7)):
        sync.broadcast(w, v, 10 * v, t)
        tag, buf = comm.sent[-1]
        tag %= PIECE  # the last piece goes under LAST + tag (link-internal)
        m = wire.unpack(buf, tag)
        assert cache.apply(m.count, m.seq, int(m.a), m.arrays)
        assert np.abs(cache.params - w).max() < 1e-3
        if v == 4:
            sync.request_keyframe(1, held=v)
        t += 1.0
    kinds = [wire.unpack(b, tag % PIECE).count for tag, b in comm.sent]
    assert kinds == [wc.FULL, wc.DELTA, wc.DELTA, wc.FULL, wc.DELTA, wc.FULL, wc.DELTA]
    row = sync.take()
    assert row["weights_sent"] == 7 and row["weights_keyframes"] == 3
    assert row["weights_interval"] == pytest.approx(10.0)


def test_a_stale_keyframe_request_sends_no_second_keyframe():
    """Deltas already on the wire when one fails each fail at the site and ask again
    (KEYFRAME carries the version the site holds).  The first request makes the next broadcast
    a keyframe; a request from a site that still holds a version older than that keyframe is
    stale and changes nothing (a redundant keyframe took 8.5 s on MinAtar at 0.5 Mb/s)."""
    n, comm = 5000, _Comm()
    wire = Wire(np.dtype([("x", "<f4")]), n)
    cfg = _Cfg(every="1")
    cfg.weights_keyframe_every = 100
    sync = _sync(cfg, wire, {1: _Site(comm, math.inf)})
    walk = list(_walk(n, steps=6))
    for v in range(3):  # key 0, delta 1, delta 2 on the wire
        sync.broadcast(walk[v], v, v, float(v))
    sync.request_keyframe(1, held=0)  # delta 1 did not apply: the site holds version 0
    sync.broadcast(walk[3], 3, 3, 3.0)  # the keyframe it asked for
    sync.request_keyframe(1, held=0)  # delta 2 failed too, before the keyframe arrived: stale
    sync.broadcast(walk[4], 4, 4, 4.0)
    sync.request_keyframe(1, held=4)  # a delta after the keyframe failed: a real request
    sync.broadcast(walk[5], 5, 5, 5.0)
    kinds = [wire.unpack(b, tag % PIECE).count for tag, b in comm.sent]
    assert kinds == [wc.FULL, wc.DELTA, wc.DELTA, wc.FULL, wc.DELTA, wc.FULL]


def test_auto_interval_from_link_rate():
    """auto: a 18,480-byte broadcast on 1 Mb/s at share 0.25 waits 0.59 s and >= 100 updates."""
    from mpirl.transport.weight_sync import AUTO_MIN_UPDATES

    n = 4610
    wire = Wire(np.dtype([("x", "<f4")]), n)
    site = _Site(_Comm(), 1e6)
    sync = _sync(_Cfg(encoding="full"), wire, {1: site})
    sync.broadcast(np.zeros(n, np.float32), 0, 0, 0.0)
    gap = (40 + 4 * n) * 8 / 1e6 / 0.25
    assert not sync.due(AUTO_MIN_UPDATES - 1, 100.0)
    assert not sync.due(AUTO_MIN_UPDATES, gap - 0.01)
    assert sync.due(AUTO_MIN_UPDATES, gap + 0.01)
    fast = _sync(_Cfg(encoding="full"), wire, {1: _Site(_Comm(), math.inf)})
    fast.broadcast(np.zeros(n, np.float32), 0, 0, 0.0)
    assert fast.due(AUTO_MIN_UPDATES, 0.0)


def test_sync_two_sites_one_version_two_vectors():
    """Site 1 holds version 1 from a delta, site 2 from a keyframe (it asked for one): the same
    version, two vectors. Each gets a delta from its own, and both rebuild within one step."""

    n = 5000
    wire = Wire(np.dtype([("x", "<f4")]), n)
    comms = {1: _Comm(), 2: _Comm()}
    sync = _sync(_Cfg(every="1"), wire, {r: _Site(c, math.inf) for r, c in comms.items()})
    caches = {1: wc.WeightCache(), 2: wc.WeightCache()}
    for v, w in enumerate(_walk(n, steps=4)):
        if v == 1:
            sync.request_keyframe(2, held=0)
        sync.broadcast(w, v, v, float(v))
        for r, comm in comms.items():
            tag, buf = comm.sent[-1]
            tag %= PIECE  # the last piece goes under LAST + tag (link-internal)
            m = wire.unpack(buf, tag)
            assert caches[r].apply(m.count, m.seq, int(m.a), m.arrays), (r, v)
            assert np.abs(caches[r].params - w).max() < 1e-3


def test_policy_lags_are_bounded_without_progress_rows():
    """--progress-seconds 0 never takes the lags: what the learner keeps of them is bounded."""
    from mpirl.transport.weight_sync import LAGS_KEPT

    sync = _sync(_Cfg(every="1"), Wire(np.dtype([("x", "<f4")]), 4), {1: _Site(_Comm(), 1e6)})
    for _ in range(30):
        sync.observe_lags(np.arange(10_000))
    assert len(sync.lags) == LAGS_KEPT
