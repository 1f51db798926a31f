"""A checkpoint writes the replay memory without copying it, and --resume reads it back into
the live memory a chunk at a time: neither needs a second copy of a memory of gigabytes (the
documented 1M-transition Pong memory is 8.45 GB).  tracemalloc counts numpy's buffers, so its
peak is the extra memory a checkpoint or a restore takes; the resume is also measured as the
process's peak RSS."""

import json
import os
import subprocess
import sys
import textwrap
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from mpirl.replay import FrameReplay, PrioritizedReplay
from mpirl.run import checkpoint as ck
from mpirl.transport.wire import transition_dtype


def _vector_memory(fill: bool = True):
    """1M CartPole transitions: a 48 MB ring, full and wrapped (``fill=False``: empty)."""
    rec = transition_dtype((4,), np.float32)
    cap, k = 1_000_000, 1 << 16
    m = PrioritizedReplay(cap, rec, seed=0)
    if not fill:
        return m, m._storage.nbytes
    rng = np.random.default_rng(0)
    chunk = np.zeros(k, rec)
    chunk["obs"] = rng.normal(size=(k, 4))
    chunk["action"] = rng.integers(0, 2, k)
    for _ in range(cap // k + 2):
        m.add(chunk, rng.random(k))
    s = m.sample(256)
    m.update(s.indices, s.generations, rng.random(256) * 3)
    return m, m._storage.nbytes


def _frame_memory(fill: bool = True):
    """Atari-shaped frames: a 51 MB frame ring, wrapped, some transitions retired (``fill=False``:
    empty)."""
    m = FrameReplay(6000, 4, (1, 84, 84), 1.2, seed=0)
    if not fill:
        return m, m.frames.nbytes + m.memory._storage.nbytes
    rng = np.random.default_rng(0)
    rec = np.zeros(64, m.dtype)
    rec["frames"] = np.arange(64)[:, None] + np.array([0, 1, 2, 3, 5, 6, 7, 8])
    table = rng.integers(0, 255, (72, 1, 84, 84), dtype=np.uint8)  # 1.125 frames/transition
    for _ in range(140):
        m.add(rec, rng.random(64), table)
    rec2 = np.zeros(8, m.dtype)  # a few groups with many frames each: the ring retires
    rec2["frames"] = np.arange(8)[:, None] * 8 + np.arange(8)
    for _ in range(12):
        m.add(rec2, rng.random(8), rng.integers(0, 255, (64, 1, 84, 84), dtype=np.uint8))
    assert m.retired > 0 and m.frames_in > m.frame_capacity
    return m, m.frames.nbytes + m.memory._storage.nbytes


@pytest.mark.parametrize("make", [_vector_memory, _frame_memory], ids=["vector", "frames"])
def test_checkpoint_peak_memory_is_a_fraction_of_the_ring(tmp_path, make):
    memory, ring = make()
    tracemalloc.start()
    try:
        arrays, meta = ck.memory_state(memory)
        part = ck.write_part(tmp_path, 1, "buffer-0", {"replay": meta}, arrays)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    print(
        f"{make.__name__}: ring {ring / 2**20:.1f} MiB, peak extra while saving "
        f"{peak / 2**20:.1f} MiB"
    )
    assert peak < ring / 8, (
        f"a checkpoint took {peak / 2**20:.1f} MiB beside a {ring / 2**20:.1f} MiB ring"
    )
    # what was written is what the manifest says, and restores the same memory
    path = tmp_path / ck.DIRNAME / "000001" / "buffer-0.npz"
    want = part["files"]["buffer-0.npz"]
    assert want["bytes"] == path.stat().st_size and want["sha256"] == ck._sha256(path)
    meta = json.loads(json.dumps(part["meta"]))["replay"]
    with np.load(path, allow_pickle=False) as z:
        loaded = {k: z[k] for k in z.files}
    back, _ = make()
    ck.restore_memory(back, loaded, meta)
    assert len(back) == len(memory) and back.inserted == memory.inserted
    inner = getattr(memory, "memory", memory)
    binner = getattr(back, "memory", back)
    np.testing.assert_array_equal(binner.priorities(), inner.priorities())
    np.testing.assert_array_equal(binner._storage, inner._storage)
    if hasattr(memory, "frames"):
        f = min(memory.frames_in, memory.frame_capacity)
        np.testing.assert_array_equal(back.frames[:f], memory.frames[:f])


def _same_memory(back, memory) -> None:
    assert len(back) == len(memory) and back.inserted == memory.inserted
    inner, binner = getattr(memory, "memory", memory), getattr(back, "memory", back)
    np.testing.assert_array_equal(binner.priorities(), inner.priorities())
    n = len(inner._storage) if inner.inserted >= inner.capacity else inner.inserted
    assert binner._storage[:n].tobytes() == inner._storage[:n].tobytes()
    if hasattr(memory, "frames"):
        f = min(memory.frames_in, memory.frame_capacity)
        np.testing.assert_array_equal(back.frames[:f], memory.frames[:f])
        assert back.retired == memory.retired and list(back._groups) == list(memory._groups)
    a, b = memory.sample(64), back.sample(64)  # the same RNG state: the same next batch
    np.testing.assert_array_equal(a.indices, b.indices)
    np.testing.assert_array_equal(a.weights, b.weights)


def _saved(tmp_path, memory) -> dict:
    arrays, meta = ck.memory_state(memory)
    ck.write_part(tmp_path, 1, "buffer-0", {"replay": meta}, arrays)
    ck.write_manifest(tmp_path, 1, ["buffer-0"], {"config": {}, "world_size": 3, "layout": []})
    manifest, skipped = ck.select(tmp_path)
    assert skipped == []
    return manifest


@pytest.mark.parametrize("make", [_vector_memory, _frame_memory], ids=["vector", "frames"])
def test_resume_peak_memory_is_a_fraction_of_the_ring(tmp_path, make):
    """--resume: load_part + restore_memory into a memory built empty, as a resumed rank does;
    the checkpoint's arrays are read into the live ring a chunk at a time."""
    memory, ring = make()
    manifest = _saved(tmp_path, memory)
    back, _ = make(fill=False)
    tracemalloc.start()
    try:
        part = ck.load_part(tmp_path, manifest, "buffer-0")
        ck.restore_memory(back, part.arrays, part.meta["replay"])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    print(
        f"{make.__name__}: ring {ring / 2**20:.1f} MiB, peak extra while restoring "
        f"{peak / 2**20:.1f} MiB"
    )
    assert peak < ring / 8, (
        f"a resume took {peak / 2**20:.1f} MiB beside a {ring / 2**20:.1f} MiB ring"
    )
    _same_memory(back, memory)


RESUME_RSS = textwrap.dedent("""
    import sys
    import numpy as np
    from mpirl.run import checkpoint as ck
    from mpirl.replay import PrioritizedReplay
    from mpirl.transport.wire import transition_dtype

    def kib(key):
        with open("/proc/self/status") as f:
            return next(int(x.split()[1]) for x in f if x.startswith(key))

    run = sys.argv[1]
    manifest, _ = ck.select(run)  # reads every file once (page cache, not this process)
    m = PrioritizedReplay(1_000_000, transition_dtype((4,), np.float32), seed=1)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # the peak (VmHWM) starts again from here
    empty = kib("VmRSS:")
    part = ck.load_part(run, manifest, "buffer-0")
    ck.restore_memory(m, part.arrays, part.meta["replay"])
    print(empty, kib("VmRSS:"), kib("VmHWM:"))
""")


def test_resume_peak_rss_is_the_memory_plus_a_chunk(tmp_path):
    """The same in a fresh process, as peak RSS: restoring a full 1M-transition CartPole memory
    (a 45.8 MiB ring) into a memory built empty peaks at the ring plus a chunk or two above the
    process before the restore (load_part's copy and a padded second copy: 3.5 rings)."""
    from mpirl.replay.memory import COPY_BYTES

    if not Path("/proc/self/clear_refs").exists():
        pytest.skip("needs Linux /proc to reset the peak RSS")
    memory, ring = _vector_memory()
    _saved(tmp_path, memory)
    del memory
    repo = Path(__file__).resolve().parents[1]
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(repo), os.environ.get("PYTHONPATH", "")])
    )
    p = subprocess.run(
        [sys.executable, "-c", RESUME_RSS, str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert p.returncode == 0, p.stderr
    empty, restored, peak = (int(x) * 1024 for x in p.stdout.split())
    print(
        f"RSS: {empty / 2**20:.1f} MiB with the memory built empty, {restored / 2**20:.1f} "
        f"MiB restored, peak {peak / 2**20:.1f} MiB: {(peak - empty) / 2**20:.1f} MiB for "
        f"the resume ({ring / 2**20:.1f} MiB ring, chunks of {COPY_BYTES / 2**20:.0f} MiB)"
    )
    assert peak - empty < ring + 3 * COPY_BYTES, (
        f"the resume of a {ring / 2**20:.1f} MiB ring peaked {(peak - empty) / 2**20:.1f} MiB "
        "above the memory built empty"
    )


def test_part_checksum_is_taken_while_writing(tmp_path, monkeypatch):
    """No second pass over a part's files (a read of the replay memory's size) for its SHA-256;
    the manifest's figures are still the files' own."""
    import hashlib

    import torch

    def read_back(path):
        raise AssertionError(f"write_part read {path} back to hash it")

    monkeypatch.setattr(ck, "_sha256", read_back)
    arrays = {
        "a": np.arange(10_000, dtype=np.float64)[::3],
        "b": np.zeros((0, 4), np.uint8),
        "c": np.array(7, np.int64),
    }
    part = ck.write_part(tmp_path, 3, "learner", {}, arrays, {"w": torch.arange(5.0)})
    d = tmp_path / ck.DIRNAME / "000003"
    for fname, want in part["files"].items():
        data = (d / fname).read_bytes()
        assert want == {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    with np.load(d / "learner.npz", allow_pickle=False) as z:
        np.testing.assert_array_equal(z["a"], arrays["a"])
        assert z["b"].shape == (0, 4) and z["c"] == 7
    assert torch.equal(torch.load(d / "learner.pt", weights_only=True)["w"], torch.arange(5.0))


def test_checkpoint_time_limits_grow_with_the_memory():
    """The learner's wait for every buffer's acknowledgement covers writing the buffer's replay
    memory at ck.MIN_WRITE_BYTES_PER_S: the documented 1M-transition Pong memory (8.45 GB) needs
    ~340 s at that rate, which the fixed 120 s limit turned into an abort."""
    pytest.importorskip("ale_py")
    from mpirl.agent import envs
    from mpirl.replay.build import replay_footprint
    from mpirl.roles.learner import CKPT_TIMEOUT_S
    from mpirl.run.config import Config
    from mpirl.wiring import checkpoint_timeout_s

    cfg = Config(env="ALE/Pong-v5", replay_capacity=1_000_000)
    spec = envs.inspect(cfg.env)
    need = replay_footprint(cfg, spec)
    assert need > 8e9
    assert checkpoint_timeout_s(cfg, spec) >= CKPT_TIMEOUT_S + need / ck.MIN_WRITE_BYTES_PER_S
    small = Config()
    assert checkpoint_timeout_s(small, envs.inspect(small.env)) < CKPT_TIMEOUT_S + 5
