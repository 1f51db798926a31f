import numpy as np
import pytest

from mpirl.transport.wire import HEADER, Tag, Wire, WireError, pack, transition_dtype


@pytest.fixture
def wire():
    return Wire(transition_dtype((4,), np.float32), n_params=10)


def records(wire, n, seed=0):
    rng = np.random.default_rng(seed)
    r = np.zeros(n, wire.record)
    r["obs"] = rng.normal(size=(n, 4))
    r["next_obs"] = rng.normal(size=(n, 4))
    r["action"] = rng.integers(0, 2, n)
    r["reward"] = rng.normal(size=n)
    r["discount"] = 0.99
    return r


def test_experience_round_trip(wire):
    rec = records(wire, 5)
    buf = wire.experience(rec, np.arange(5), [1.0, 2.5], env_steps=7, seq=3)
    assert buf.dtype == np.uint8
    m = wire.unpack(buf, Tag.EXPERIENCE)
    assert m.kind == Tag.EXPERIENCE and m.count == 5 and m.seq == 3 and m.a == 7
    np.testing.assert_array_equal(m.arrays["records"], rec)
    np.testing.assert_array_equal(m.arrays["returns"], [1.0, 2.5])
    np.testing.assert_array_equal(m.arrays["td_abs"], np.arange(5, dtype=np.float32))


def test_empty_experience(wire):
    buf = wire.experience(np.zeros(0, wire.record), [], [], env_steps=3, seq=0)
    m = wire.unpack(buf, Tag.EXPERIENCE)
    # the header and the acting weights version (acting i8[1]) only
    assert m.count == 0 and len(m.records) == 0 and buf.nbytes == HEADER.itemsize + 8


def test_batch_and_priorities_round_trip(wire):
    from mpirl.replay import Sample

    rec = records(wire, 4)
    s = Sample(
        indices=np.array([3, 1, 4, 1]),
        generations=np.array([0, 2, 0, 2]),
        weights=np.ones(4),
        priorities=np.array([0.5, 0.25, 1, 0.25]),
        records=rec,
    )
    m = wire.unpack(wire.batch(s, batch_id=9, t_send=1.5, max_weight=3.5), Tag.BATCH)
    assert m.seq == 9 and m.a == 1.5 and m.b == 3.5  # b: the weights' normaliser
    assert wire.unpack(wire.batch(s, 9, 1.5, max_weight=1e300), Tag.BATCH).b == 1e9  # clipped
    np.testing.assert_array_equal(m.arrays["indices"], s.indices)
    np.testing.assert_array_equal(m.arrays["records"], rec)
    p = wire.unpack(
        wire.priorities(s.indices, s.generations, [1, 2, 3, 4], 9, 1.5, updates=1234),
        Tag.PRIORITIES,
    )
    assert p.seq == 9 and p.a == 1.5 and p.b == 1234  # the learner's updates: buffers' beta
    np.testing.assert_array_equal(p.arrays["generations"], s.generations)
    np.testing.assert_array_equal(p.arrays["td_abs"], [1, 2, 3, 4])


def test_weights_stats_control(wire):
    w = wire.unpack(wire.weights(np.arange(10), version=4, updates=100), Tag.WEIGHTS)
    assert w.seq == 4 and w.a == 100 and w.arrays["params"][-1] == 9
    s = wire.unpack(wire.stats([1.0], env_steps=50, episodes=3), Tag.STATS)
    assert s.a == 50 and s.b == 3 and list(s.arrays["returns"]) == [1.0]
    assert wire.unpack(wire.credit(3, 12.0), Tag.CREDIT).count == 3
    assert wire.unpack(wire.stop(), Tag.STOP).kind == Tag.STOP
    assert wire.unpack(wire.done(5, 2), Tag.DONE).a == 5


@pytest.mark.parametrize(
    "mangle, match",
    [
        (lambda b: b[:10], "shorter than the 40-byte header"),
        (lambda b: np.concatenate([b, np.zeros(3, np.uint8)]), "must be"),
        (lambda b: np.zeros_like(b), "bad magic"),
    ],
)
def test_malformed_rejected(wire, mangle, match):
    buf = wire.experience(records(wire, 2), [1, 2], [], 0, 0)
    with pytest.raises(WireError, match=match):
        wire.unpack(mangle(buf), Tag.EXPERIENCE, "actor (site rank 3)")


def test_mismatched_tag_and_version(wire):
    buf = wire.stop()
    with pytest.raises(WireError, match="header says STOP"):
        wire.unpack(buf, Tag.DONE)
    h = buf[: HEADER.itemsize].view(HEADER)
    h["version"] = 99
    with pytest.raises(WireError, match="wire version 99"):
        wire.unpack(buf, Tag.STOP)


def test_other_obs_shape_is_rejected(wire):
    other = Wire(transition_dtype((8,), np.float32), 10)
    buf = other.forward(np.zeros(2, other.record), [1, 1], 0)
    with pytest.raises(WireError, match="mismatched observation shape"):
        wire.unpack(buf, Tag.FORWARD, "buffer 0")


def test_pack_header_only():
    assert pack(Tag.STOP).nbytes == 40


def test_every_kind_has_a_view_that_names_its_header_slots(wire):
    """The named fields read the slots the packers write: a field that reads the wrong slot
    (PRIORITIES' learner updates are in b, WEIGHTS' in a) fails here."""
    from mpirl.replay import Sample
    from mpirl.transport.wire import VIEWS

    assert set(VIEWS) == set(Tag)
    s = Sample(
        indices=np.arange(3),
        generations=np.arange(3),
        weights=np.ones(3, np.float32),
        priorities=np.ones(3, np.float32),
        records=records(wire, 3),
    )
    cases = [
        (
            wire.experience(records(wire, 2), [1, 2], [5.0], env_steps=9, seq=4),
            {"n": 2, "msg_no": 4, "env_steps": 9, "n_returns": 1},
        ),
        (wire.credit(6, samples=11.0), {"tokens": 6, "samples": 11.0}),
        (
            wire.weights(np.zeros(10), version=3, updates=77),
            {"version": 3, "updates": 77, "encoding": 0},
        ),
        (wire.keyframe(8), {"version": 8}),
        (wire.forward(records(wire, 2), [1, 2], seq=5), {"n": 2, "msg_no": 5}),
        (
            wire.batch(s, 12, 3.5, max_weight=2.25),
            {"n": 3, "batch_id": 12, "t_send": 3.5, "max_weight": 2.25},
        ),
        (
            wire.priorities(np.arange(3), np.arange(3), np.ones(3), 12, 3.5, updates=41),
            {"n": 3, "batch_id": 12, "t_echo": 3.5, "updates": 41},
        ),
        (
            wire.stats([1.0, 2.0], 100, 7, weights_updates=40),
            {"n_returns": 2, "env_steps": 100, "episodes": 7, "weights_updates": 40},
        ),
        (wire.stop(9), {"checkpoint": 9}),
        (wire.done(50, 4), {"env_steps": 50, "episodes": 4}),
        (wire.checkpoint(2, 60), {"id": 2, "env_steps": 60}),
        (
            wire.order(3, 64, 0.5, 0.75),
            {"id": 3, "n": 64, "beta": 0.5, "scale": 0.75, "version": -1, "relayed": False},
        ),
        (wire.shard(np.zeros(4, np.uint8)), {}),
        (
            wire.grad(5, 2, np.ones(3, np.float32), 0.25, 1.5),
            {"id": 5, "version": 2, "n": 3, "loss": 0.25, "compute_s": 1.5, "has_grad": False},
        ),
    ]
    assert {Tag(int(b[: HEADER.itemsize].view(HEADER)["kind"][0])) for b, _ in cases} == set(Tag)
    for buf, fields in cases:
        kind = Tag(int(buf[: HEADER.itemsize].view(HEADER)["kind"][0]))
        m = wire.unpack(buf, kind, rank=2, t=1.5)
        assert type(m) is VIEWS[kind] and m.rank == 2 and m.t == 1.5 and m.buf is buf
        assert {k: getattr(m, k) for k in fields} == fields, kind.name
