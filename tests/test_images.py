"""Image observations: preprocessing, frames stored once, CNN agreement, compressed wire layout.

Skipped cleanly without the images extra (``pip install -e ".[images]"``), failed instead under
MPIRL_REQUIRE_IMAGES=1 (CI); the error a missing extra gives is tested in test_envs.py, which
runs either way.
"""

import images_extra
import numpy as np
import pytest

from mpirl.agent import envs

images_extra.require()  # skips without the extra; fails under MPIRL_REQUIRE_IMAGES=1 (CI)

from mpirl.agent import qnet  # noqa: E402
from mpirl.agent.frames import FrameLog, compact, concat, record_dtype, stacks  # noqa: E402
from mpirl.agent.nstep import NStep  # noqa: E402
from mpirl.replay import FrameReplay  # noqa: E402
from mpirl.transport.wire import FLAG_ZSTD, HEADER, Tag, Wire, WireError  # noqa: E402


def test_a_frameskip_in_env_kwargs_is_a_config_error_naming_it():
    """ALE's own frameskip on top of the preprocessing's 4 would act every 16 frames (or make
    gymnasium's AtariPreprocessing raise a bare ValueError); it is one clear error instead."""
    from mpirl.run.config import ConfigError

    with pytest.raises(ConfigError, match=r"frameskip=4 .*remove frameskip from --env-kwargs"):
        envs.inspect("ALE/Pong-v5", {"frameskip": 4})
    envs.make("ALE/Pong-v5", kwargs={"frameskip": 1}).close()  # the value mpirl uses is fine


@pytest.fixture(scope="module")
def pong():
    return envs.inspect("ALE/Pong-v5")


def test_atari_preprocessing_shapes(pong):
    assert pong.obs_shape == (4, 84, 84) and pong.obs_dtype == np.uint8
    assert pong.frame_shape == (1, 84, 84) and pong.stack == 4
    assert pong.obs_scale == pytest.approx(1 / 255) and pong.clip_rewards
    env = envs.make("ALE/Pong-v5", seed=0)
    o, _ = env.reset(seed=0)
    assert o.shape == (4, 84, 84) and o.dtype == np.uint8
    assert all((o[i] == o[3]).all() for i in range(3))  # padding: the reset frame 4 times
    for _ in range(20):
        prev = o
        o, r, term, trunc, info = env.step(env.action_space.sample())
        assert (o[:3] == prev[1:]).all()  # a stack shifts by one frame per agent step
        assert "lives" in info
    env.close()


def test_minatar_preprocessing_shapes():
    spec = envs.inspect("MinAtar/Breakout-v1")
    assert spec.obs_shape == (4, 10, 10) and spec.obs_dtype == np.uint8
    assert spec.frame_shape == (4, 10, 10) and spec.stack == 1 and spec.obs_scale == 1.0
    assert spec.n_actions == 3  # v1: the minimal action set
    env = envs.make("MinAtar/Breakout-v1", seed=0)
    o, _ = env.reset(seed=0)
    assert o.shape == (4, 10, 10) and o.dtype == np.uint8 and set(np.unique(o)) <= {0, 1}
    env.close()


def _atari_transitions(steps=200, n=3):
    """Real Pong transitions through FrameLog + NStep, with the true stacks to compare to."""
    env = envs.make("ALE/Pong-v5", seed=0)
    log = FrameLog(4, (1, 84, 84))
    o, _ = env.reset(seed=0)
    ids, truth, out = log.reset(o), {}, []
    ns = NStep(n, 0.99)
    for _ in range(steps):
        a = env.action_space.sample()
        nxt, r, term, trunc, _ = env.step(a)
        here, ids = ids, log.step(ids, nxt)
        truth[here], truth[ids] = o, nxt
        out += ns.push(here, a, r, ids, term, trunc, 0.0)
        o = nxt
    env.close()
    rec = np.zeros(len(out), record_dtype(4))
    rec["action"] = [t[1] for t in out]
    rec["reward"] = [t[2] for t in out]
    rec["discount"] = [t[4] for t in out]
    rec["frames"], table = log.pack([t[0] for t in out], [t[3] for t in out])
    obs = np.stack([truth[t[0]] for t in out])
    nxt = np.stack([truth[t[3]] for t in out])
    return rec, table, obs, nxt


def test_frames_stored_once_rebuild_the_stacks():
    rec, table, obs, nxt = _atari_transitions()
    o2, n2 = stacks(rec, table, 4)
    np.testing.assert_array_equal(o2, obs)
    np.testing.assert_array_equal(n2, nxt)
    assert len(table) <= len(rec) + 3 + 3  # one frame per step, + history and look-ahead
    # slicing and joining groups keeps every stack
    r1, f1 = compact(rec[:50], table)
    r2, f2 = compact(rec[50:], table)
    assert len(f1) < len(table)
    rj, fj = concat([(r1, f1), (r2, f2)])
    o3, n3 = stacks(rj, fj, 4)
    np.testing.assert_array_equal(o3, obs)
    np.testing.assert_array_equal(n3, nxt)


def _wrapped_frame_replay():
    """300 Atari-shaped transitions added in chunks of 30 to a FrameReplay whose frame ring is
    too small for them (frames_per_transition 1.05, +6 frames per chunk from one stream): the ring
    wraps first and must retire the oldest transitions, never serve bad frames."""
    rec, table, obs, nxt = _atari_transitions(steps=300)
    mem = FrameReplay(120, 4, (1, 84, 84), 1.05, seed=0)
    for k in range(0, len(rec), 30):
        r, f = compact(rec[k : k + 30], table)
        mem.add(r, np.arange(len(r)) + 1.0, f)
    return mem, rec, table, obs, nxt


def test_frame_replay_samples_true_stacks_and_retires_before_overwriting():
    mem, rec, table, obs, nxt = _wrapped_frame_replay()
    assert mem.retired > 0 and 0 < len(mem) < 120
    for _ in range(5):
        s = mem.sample(64)
        o, n = stacks(s.records, s.frames, 4)
        np.testing.assert_array_equal(o, obs[s.generations])  # generation = serial = row
        np.testing.assert_array_equal(n, nxt[s.generations])
        assert len(s.frames) <= 7 * 64
    # a priority update for a retired transition is dropped as stale
    old = np.array([0])
    assert mem.update(old, old, np.array([1.0])) == 1
    assert mem.update(s.indices, s.generations, np.ones(64)) == 0


def test_frame_replay_memory_figure():
    from mpirl.agent.frames import frames_per_transition
    from mpirl.replay import footprint_bytes, frame_footprint_bytes
    from mpirl.transport.wire import transition_dtype

    # By hand (docs/images.md): an actor message of 64 transitions from 4 env streams carries,
    # per stream, stack - 1 = 3 history and n = 3 look-ahead frames beyond one per transition,
    # +5% for episode ends: r = 1.05 * (1 + 6 * 4 / 64) = 1.44375 frames per transition.
    # 1M transitions: ceil(1.44375e6) = 1,443,750 frames of 84 * 84 = 7,056 B; records of
    # action i8 + reward f4 + discount f4 + 2 * 4 frame ids i8 = 80 B; sum/min trees 2 * 2**20
    # nodes * 16 B = 33,554,432 B; update scratch 4 B per slot.
    trees, scratch = 2 * 2**20 * 16, 4 * 1_000_000
    r = frames_per_transition(4, 3, 4, 64)
    assert r == pytest.approx(1.44375, rel=1e-12)
    dedup = frame_footprint_bytes(1_000_000, 4, (1, 84, 84), r)
    assert dedup == 1_443_750 * 7056 + 80 * 1_000_000 + trees + scratch == 10_304_654_432
    # --actor-chunk 256: r = 1.05 * (1 + 24 / 256) = 1.1484375 -> 1,148,438 frames (8.2 GB)
    r256 = frames_per_transition(4, 3, 4, 256)
    assert (
        frame_footprint_bytes(1_000_000, 4, (1, 84, 84), r256)
        == 1_148_438 * 7056 + 80 * 1_000_000 + trees + scratch
        == 8_220_932_960
    )
    # whole transitions: obs and next_obs 4 * 84 * 84 B each + action 8 + reward 4 + discount 4
    naive = footprint_bytes(1_000_000, transition_dtype((4, 84, 84), np.uint8))
    assert naive == (2 * 28_224 + 16) * 1_000_000 + trees + scratch == 56_501_554_432


@pytest.mark.parametrize(
    "shape, n_actions", [((4, 84, 84), 6), ((4, 10, 10), 3), ((10, 10, 10), 6)]
)
@pytest.mark.parametrize("dueling", [False, True])
def test_cnn_actor_forward_equals_learner_forward(shape, n_actions, dueling):
    import torch

    torch.manual_seed(0)
    scale = 1 / 255 if shape[1] == 84 else 1.0
    net = qnet.make_torch_q(shape, n_actions, (), dueling, scale)
    flat = net.flat_params()
    assert flat.dtype == np.float32
    assert flat.size == qnet.param_count(shape, n_actions, (256, 256), dueling)
    names = [n for n, _ in net.named_parameters()]
    assert names[0] == "convs.0.weight" and names[-1].startswith("heads.")
    actor = qnet.TorchActorQ(shape, n_actions, dueling, scale)
    actor.load(flat.copy())
    hi = 256 if scale != 1.0 else 2
    x = np.random.default_rng(0).integers(0, hi, (5,) + shape).astype(np.uint8)
    with torch.no_grad():
        want = net(torch.from_numpy(x)).numpy()
    got = actor(x)
    assert got.shape == (5, n_actions)
    np.testing.assert_array_equal(got, want)
    with pytest.raises(ValueError, match="parameters"):
        actor.load(flat[:-1])


def test_nature_cnn_layout():
    convs, fc = qnet.conv_layers((4, 84, 84))
    assert convs == [(32, 4, 8, 4), (64, 32, 4, 2), (64, 64, 3, 1)] and fc == 512
    assert qnet.conv_layers((4, 10, 10)) == ([(16, 4, 3, 1)], 128)
    # 84 -> 20 -> 9 -> 7: 3136 inputs to the FC, 1.69 M parameters for 6 actions
    assert qnet.param_count((4, 84, 84), 6, (), False) == 1_687_206


@pytest.fixture
def iwire():
    return Wire(record_dtype(4), n_params=10, frame_shape=(1, 84, 84), compress=True)


def test_image_wire_layout_and_compression_round_trip(iwire):
    rec, table, _, _ = _atari_transitions(steps=80)
    td = np.arange(len(rec), dtype=np.float32)
    # EXPERIENCE (inside a site): never compressed; nframes i8[1] right after the header
    e = iwire.experience(rec, td, [3.0], env_steps=9, seq=1, frames=table)
    h = e[: HEADER.itemsize].view(HEADER)[0]
    assert int(h["kind"]) == Tag.EXPERIENCE
    assert e[40:48].view("<i8")[0] == len(table)
    m = iwire.unpack(e, Tag.EXPERIENCE)
    np.testing.assert_array_equal(m.arrays["frames"], table)
    np.testing.assert_array_equal(m.arrays["records"], rec)
    assert m.raw_nbytes == 0
    # FORWARD over the link: FLAG_ZSTD in the high byte of kind, raw_nbytes, zstd frame
    f = iwire.forward(rec, td, seq=4, frames=table)
    raw = iwire.last_raw_nbytes
    h = f[: HEADER.itemsize].view(HEADER)[0]
    assert int(h["kind"]) == Tag.FORWARD | FLAG_ZSTD and int(h["count"]) == len(rec)
    assert f[40:48].view("<i8")[0] == raw - HEADER.itemsize
    assert f.nbytes < raw / 10  # Atari frames compress well (Pong: ~100x)
    m = iwire.unpack(f, Tag.FORWARD, "buffer 0")
    assert m.raw_nbytes == raw and m.seq == 4
    np.testing.assert_array_equal(m.arrays["frames"], table)
    np.testing.assert_array_equal(m.arrays["records"], rec)
    np.testing.assert_array_equal(m.arrays["td_abs"], td)
    # the same message uncompressed is byte-identical to the decompressed one
    plain = Wire(record_dtype(4), 10, frame_shape=(1, 84, 84), compress=False)
    p = plain.forward(rec, td, seq=4, frames=table)
    assert p.nbytes == raw and int(p[:40].view(HEADER)[0]["kind"]) == Tag.FORWARD
    # a receiver decodes compressed and plain messages alike
    assert plain.unpack(f, Tag.FORWARD).raw_nbytes == raw


def test_batch_compressed_round_trip(iwire):
    from mpirl.replay import Sample

    rec, table, _, _ = _atari_transitions(steps=40)
    n = len(rec)
    s = Sample(
        indices=np.arange(n),
        generations=np.arange(n) + 5,
        weights=np.ones(n),
        priorities=np.full(n, 0.5),
        records=rec,
        frames=table,
    )
    m = iwire.unpack(iwire.batch(s, batch_id=2, t_send=1.25), Tag.BATCH)
    assert m.a == 1.25 and m.raw_nbytes > 0
    np.testing.assert_array_equal(m.arrays["generations"], s.generations)
    np.testing.assert_array_equal(m.arrays["frames"], table)


def test_bad_compressed_messages_are_rejected(iwire):
    rec, table, _, _ = _atari_transitions(steps=20)
    f = iwire.forward(rec, np.ones(len(rec)), 0, frames=table)
    bad = f.copy()
    bad[60:80] ^= 0xFF
    with pytest.raises(WireError, match="buffer 0"):
        iwire.unpack(bad, Tag.FORWARD, "buffer 0")
    short = f.copy()
    short[40:48].view("<i8")[0] += 1  # raw_nbytes disagrees with the body
    with pytest.raises(WireError, match="decompress|header says"):
        iwire.unpack(short, Tag.FORWARD, "buffer 0")
    flags = f.copy()
    flags[:40].view(HEADER)["kind"] |= 0x200
    with pytest.raises(WireError, match="unknown flags"):
        iwire.unpack(flags, Tag.FORWARD, "buffer 0")


def test_vector_wire_can_compress_too():
    from mpirl.transport.wire import transition_dtype

    w = Wire(transition_dtype((4,), np.float32), 10, compress=True)
    r = np.zeros(64, w.record)
    buf = w.forward(r, np.ones(64), 3)
    assert int(buf[:40].view(HEADER)[0]["kind"]) & FLAG_ZSTD
    m = w.unpack(buf, Tag.FORWARD)
    np.testing.assert_array_equal(m.arrays["records"], r)


def test_frame_replay_checkpoint_round_trip():
    mem, rec, table, obs, nxt = _wrapped_frame_replay()
    arrays, meta = mem.checkpoint_state()
    import json

    meta = json.loads(json.dumps(meta))  # it must survive JSON
    back = FrameReplay(120, 4, (1, 84, 84), 1.05, seed=5)
    back.restore_checkpoint(arrays, meta)
    assert len(back) == len(mem) and back.inserted == mem.inserted
    np.testing.assert_array_equal(back.memory.priorities(), mem.memory.priorities())
    s1 = mem.sample(32)
    s2 = back.sample(32)  # same RNG state restored: the same draw
    np.testing.assert_array_equal(s1.indices, s2.indices)
    np.testing.assert_array_equal(s1.frames, s2.frames)
    o, n = stacks(s2.records, s2.frames, 4)
    np.testing.assert_array_equal(o, obs[s2.generations])
    np.testing.assert_array_equal(n, nxt[s2.generations])
    # it goes on: more groups, retirement continues where it stopped
    r, f = compact(rec[:30], table)
    back.add(r, np.ones(len(r)), f)
    s3 = back.sample(16)
    assert s3.generations.min() >= back.memory._tail
