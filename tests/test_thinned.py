"""``--replay-at thinned`` (mpirl.roles.placements.thinned): the thinning rule at the edge, the
learner's importance weights (as documented, and unbiased over every produced transition at
beta = 1), the bounded staging queue, b = 1 being ``--replay-at learner`` byte for byte, both
sides' checkpoints, the wire, the config, and a short run under mpirun."""

import json
import math

import images_extra
import numpy as np
import pytest
from mpirun import read_h5, run_mpirl

from mpirl.errors import ConfigError
from mpirl.fakes import wire_of
from mpirl.replay.build import make_replay
from mpirl.roles.placements import PLACEMENTS, pick, thinned
from mpirl.roles.placements.at_learner import SiteForwarding
from mpirl.roles.placements.thinned import (
    FLOOR,
    LINK_SHARE,
    SiteThinning,
    ThinnedMemory,
    Thinner,
    replay_ratio_of,
    solve_threshold,
)
from mpirl.run.config import Config, build_parser
from mpirl.transport.link import LinkProfile
from mpirl.transport.wire import Tag, keep_code, keep_value


class Capture:
    """A link end that keeps what is posted on it."""

    def __init__(self, rate_bps: float = float("inf")) -> None:
        self.profile = LinkProfile(rate_bps=rate_bps)
        self.posts: list[np.ndarray] = []

    def post(self, buf: np.ndarray, tag: int | None = None, now: float | None = None) -> float:
        self.posts.append(buf)
        return 0.0


def _experience(wire, td: np.ndarray, first: int = 0):
    """An EXPERIENCE of ``len(td)`` transitions whose reward field holds their serial number."""
    rec = np.zeros(len(td), wire.record)
    rec["reward"] = np.arange(first, first + len(td))
    return wire.unpack(wire.experience(rec, td, [], 0, 0), Tag.EXPERIENCE)


def _site(cfg, link=None, rho=None, seed=0):
    spec, wire = wire_of(cfg)
    thinner = Thinner(cfg.alpha, cfg.priority_eps, rho, seed)
    return SiteThinning(cfg, spec, wire, link or Capture(), lambda out: None, thinner), wire


def _memory(cfg, wire, spec=None):
    spec = spec or wire_of(cfg)[0]
    memory = make_replay(cfg, spec, wire.record, seed=1)
    return ThinnedMemory(cfg, memory, {}, wire, None, None, lambda: 0, lambda m: False, 1)


def test_the_threshold_gives_the_budget_as_mean_probability():
    rng = np.random.default_rng(0)
    q = (rng.lognormal(0, 1.5, 4096) + 1e-3) ** 0.6
    for b in (0.05, 0.25, 0.7):
        tau = solve_threshold(q, b)
        f = np.clip(q / tau, FLOOR * b, 1)
        assert f.mean() == pytest.approx(b, rel=1e-6)
        assert f.min() == pytest.approx(FLOOR * b) and f.max() == (1.0 if b > 0.2 else f.max())
        assert np.corrcoef(q, f)[0, 1] > 0.5  # higher priority, likelier to go
    equal = np.full(100, 2.0)  # no spread: everyone gets b
    assert np.clip(equal / solve_threshold(equal, 0.3), 0.03, 1) == pytest.approx(0.3)


def test_the_rho_budget_comes_from_the_replay_ratio_or_the_pacing():
    assert replay_ratio_of(Config(replay_ratio=0.25), 4) == 0.25
    paced = Config(replay_ratio=0, learner_updates_per_s=46.875, actor_steps_per_s=3000)
    assert replay_ratio_of(paced, 4) == pytest.approx(0.25)  # 46.875 x 64 / 12,000
    assert replay_ratio_of(Config(replay_ratio=0), 4) is None
    assert Thinner(0.6, 1e-3, 4.0, 0).budget == 1.0 and Thinner(0.6, 1e-3, None, 0).budget == 1.0
    assert Thinner(0.6, 1e-3, 0.25, 0).budget == 0.25


def test_budget_one_forwards_everything_exactly_as_replay_at_learner():
    """No rho-budget, no link rate: every experience goes, in messages identical byte for byte
    to --replay-at learner's (no keep array, the same header)."""
    cfg = Config(replay_at="thinned", replay_ratio=0, forward_chunk=64)
    site, wire = _site(cfg)
    spec, _ = wire_of(cfg)
    plain = SiteForwarding(cfg, spec, wire, Capture(), lambda out: None)
    rng = np.random.default_rng(3)
    for k in range(10):
        m = _experience(wire, rng.random(64).astype(np.float32) * 3, 64 * k)
        site.add(m)
        plain.add(m)
    for s in (site, plain):
        s.tokens = 100
        s.ship(0.0, stopping=True)
    assert site.thinned == 0 and site.forwarded == plain.forwarded == 640
    assert len(site.link.posts) == len(plain.link.posts) == 10
    for a, b in zip(site.link.posts, plain.link.posts, strict=True):
        assert np.array_equal(a, b)
        m = wire.unpack(a, Tag.FORWARD)
        assert m.keep is None and m.produced == m.n == 64


def test_thinning_forwards_the_budget_favouring_high_priorities_and_counts_the_rest():
    cfg = Config(replay_at="thinned", replay_ratio=0.25, forward_chunk=256)
    site, wire = _site(cfg, rho=0.25)
    rng = np.random.default_rng(1)
    td = rng.lognormal(0, 1, 64 * 400).astype(np.float32)
    for k in range(400):
        site.add(_experience(wire, td[64 * k : 64 * (k + 1)], 64 * k))
        site.tokens = 100
        site.ship(float(k), stopping=False)
    site.ship(400.0, stopping=True)
    msgs = [wire.unpack(b, Tag.FORWARD) for b in site.link.posts]
    got = np.concatenate([m.records["reward"] for m in msgs]).astype(int)
    keep = np.concatenate([m.keep for m in msgs])
    assert site.forwarded == len(got) and site.thinned == len(td) - len(got)
    assert len(got) / len(td) == pytest.approx(0.25, abs=0.02)
    assert td[got].mean() > 1.5 * td.mean()  # the high priorities go (1.76x here)
    assert sum(m.produced for m in msgs) + site.pending == len(td)  # every one counted once
    # each one's f goes with it: higher priority, higher f (up to 1), never below the floor
    assert keep.min() >= FLOOR * 0.25 * 0.96 and keep.max() == 1.0  # (codes 6% apart)
    ranks = np.argsort(np.argsort(td[got])), np.argsort(np.argsort(keep))
    assert np.corrcoef(*ranks)[0, 1] > 0.9
    assert sum(m.nbytes for m in msgs) / len(td) < 0.3 * (
        wire.record.itemsize + 8
    )  # about rho x (record + |td| + f)


def test_the_link_budget_follows_an_emulated_rate():
    t = Thinner(0.6, 1e-3, None, 0)
    t.set_link(156_250.0, 12_000.0, 56.0)  # 1.25 Mb/s, CartPole's production
    assert t.budget == pytest.approx(LINK_SHARE * 156_250 / (12_000 * 56))
    t.set_link(float("inf"), 12_000.0, 56.0)  # a real link: its rate is not measured here
    assert t.budget == 1.0
    cfg = Config(replay_at="thinned", replay_ratio=0, forward_chunk=64)
    site, wire = _site(cfg, link=Capture(rate_bps=1.25e6))
    rng = np.random.default_rng(2)
    for k in range(200):  # 64 transitions each 10 ms: 6,400 per second
        site.add(_experience(wire, rng.random(64).astype(np.float32), 64 * k))
        site.tokens = 100
        site.ship(0.01 * k, stopping=False)
    per = site.fwd_bytes
    assert site.rate == pytest.approx(6400, rel=0.05)
    assert site.thinner.budget == pytest.approx(LINK_SHARE * 1.25e6 / 8 / (6400 * per), rel=0.05)
    assert site.forwarded < 0.6 * 64 * 200  # it thinned down to what the link carries


def test_the_staging_queue_is_bounded_and_what_it_drops_is_counted_as_produced():
    cfg = Config(
        replay_at="thinned",
        replay_ratio=0,
        forward_chunk=64,
        forward_credits=2,
        forward_overflow="drop-oldest",
    )
    site, wire = _site(cfg)
    for k in range(50):  # no tokens: nothing leaves
        site.add(_experience(wire, np.ones(64, np.float32), 64 * k))
        assert site.queue.len <= site.queue.limit == 256  # (4 actor chunks at least)
    assert site.queue.dropped == 50 * 64 - 256 and site.pending == site.queue.dropped
    site.tokens = 1
    site.ship(0.0, stopping=False)
    first = wire.unpack(site.link.posts[0], Tag.FORWARD)
    assert first.produced == 64 + 50 * 64 - 256  # it stands for what was dropped before it
    block = Config(replay_at="thinned", replay_ratio=0, forward_chunk=64, forward_credits=2)
    site, wire = _site(block)
    site.add(_experience(wire, np.ones(256, np.float32)))
    assert site.queue.full and not site.may_grant()  # backpressure, as --replay-at learner


def test_importance_weights_are_the_documented_formula():
    """w_i = (p_i f_i / (p_min f_min)) ** -beta, p_min and f_min over the whole memory."""
    cfg = Config(replay_at="thinned", replay_capacity=64, batch_size=32, replay_ratio=0)
    spec, wire = wire_of(cfg)
    source = _memory(cfg, wire, spec)
    rng = np.random.default_rng(4)
    td = rng.random(40).astype(np.float32) * 4
    f = keep_value(keep_code(rng.uniform(0.05, 1, 40)))
    rec = np.zeros(40, wire.record)
    rec["reward"] = np.arange(40)
    source.insert(wire.unpack(wire.forward(rec, td, 0, keep=f, produced=160), Tag.FORWARD))
    d = source.draw(0.7)
    assert d is not None
    i = d.records["reward"].astype(int)
    p = (td + cfg.priority_eps) ** cfg.alpha
    want = (p[i] * f[i] / (p.min() * f.min())) ** -0.7
    assert np.allclose(d.weights, want, rtol=1e-5) and d.weights.max() <= 1.0
    assert source.keep_min == pytest.approx(f.min()) and source.received == 40


def test_the_learner_counts_produced_transitions_so_rho_is_per_produced_one():
    """A FORWARD of 100 that stands for 400 produced: the rate limiter counts 400 (the learner
    samples rho per produced transition), the delivered count 100, and a token is owed."""
    from mpirl.roles.learner_rows import Arrivals
    from mpirl.roles.placements.common import Site

    class Rows:
        def append(self, **row: float) -> None:
            self.row = row

    cfg = Config(replay_at="thinned", replay_ratio=0.25, learning_starts=0, batch_size=50)
    spec, wire = wire_of(cfg)
    arrivals = Arrivals(0, cfg.alpha, cfg.priority_eps, np.random.default_rng(0), None)
    site = Site(1, Capture(), 1.0)
    memory = make_replay(cfg, spec, wire.record, seed=1)
    source = ThinnedMemory(
        cfg, memory, {1: site}, wire, Rows(), arrivals, lambda: 0, lambda m: False, 1
    )
    rec = np.zeros(100, wire.record)
    f = np.full(100, keep_value(keep_code(np.float32(0.25))))
    buf = wire.forward(rec, np.ones(100), 0, keep=f, produced=400)
    source.on_forward(wire.unpack(buf, Tag.FORWARD, rank=1))
    assert source.inserted == 400 and source.delivered() == 100 and source.owed[1] == 1
    assert site.served == 100 and len(memory) == 100
    drawn = [source.draw(0.4) for _ in range(4)]  # while sampled <= rho x produced = 100
    assert [d is not None for d in drawn] == [True, True, True, False]


def test_at_beta_one_the_weighted_samples_estimate_the_mean_over_everything_produced():
    """Monte Carlo: thin 20,000 transitions to a quarter by priority, sample the learner's
    memory at beta = 1: the importance-weighted mean of a per-transition value (here log |td|,
    which the thinning skews) matches its mean over every produced transition; PER's weights
    alone give the mean over the forwarded ones, far off."""
    cfg = Config(
        replay_at="thinned", replay_capacity=32_768, batch_size=64, replay_ratio=0, alpha=0.6
    )
    spec, wire = wire_of(cfg)
    source = _memory(cfg, wire, spec)
    thinner = Thinner(cfg.alpha, cfg.priority_eps, 0.25, seed=5)
    rng = np.random.default_rng(6)
    n = 20_000
    td = rng.lognormal(0, 1, n).astype(np.float32)
    value = np.log(td)
    for k in range(0, n, 250):
        f, kept = thinner.choose(td[k : k + 250])
        rec = np.zeros(int(kept.sum()), wire.record)
        rec["reward"] = value[k : k + 250][kept]
        m = wire.forward(rec, td[k : k + 250][kept], 0, keep=f[kept])
        source.insert(wire.unpack(m, Tag.FORWARD))
    assert source.received / n == pytest.approx(0.25, abs=0.02)
    num = den = plain_num = plain_den = 0.0
    for _ in range(2000):
        d = source.draw(1.0)
        v = d.records["reward"].astype(np.float64)
        w = d.weights.astype(np.float64)
        num, den = num + (w * v).sum(), den + w.sum()
        f = source.keep[d.indices].astype(np.float64)
        per = w * (f / source.keep_min)  # the f factor taken out again: PER's weights alone
        plain_num, plain_den = plain_num + (per * v).sum(), plain_den + per.sum()
    produced = value.mean()
    assert num / den == pytest.approx(produced, abs=0.1)
    assert abs(plain_num / plain_den - produced) > 0.5  # without f: the forwarded ones' mean
    # /updates td_abs_uniform's weights (1 / drawn_as = 1 / (p f)) estimate the same mean, per
    # batch (learner_rows.uniform_means), whatever beta: 2000 batches' mean of the estimates
    from mpirl.roles.learner_rows import uniform_means

    got = [
        uniform_means(d.records["reward"][None, :], d.drawn_as[None, :])[0]
        for d in (source.draw(0.4) for _ in range(2000))
    ]
    assert float(np.mean(got)) == pytest.approx(produced, abs=0.1)


def test_both_sides_resume_where_they_stopped():
    cfg = Config(replay_at="thinned", replay_capacity=512, batch_size=16, replay_ratio=0.25)
    spec, wire = wire_of(cfg)
    site, _ = _site(cfg, rho=0.25)
    rng = np.random.default_rng(7)
    for k in range(30):
        site.add(_experience(wire, rng.lognormal(0, 1, 64).astype(np.float32), 64 * k))
    site.tokens = 3
    site.ship(1.0, stopping=False)
    shipped = len(site.link.posts)
    assert shipped and site.queue.len
    source = _memory(cfg, wire, spec)
    source.limiter.inserted = 10**6  # (insert alone does not count: the learner may sample)
    for buf in site.link.posts:
        source.insert(wire.unpack(buf, Tag.FORWARD))
    # the edge: queue with each one's f, counters and the rule's state
    meta, arrays = site.save()
    meta = json.loads(json.dumps(meta))  # what a checkpoint's JSON keeps
    back, _ = _site(cfg, rho=0.25, seed=0)
    back.restore(meta, {k: np.array(v) for k, v in arrays.items()})
    assert back.queue.len == site.queue.len and back.pending == site.pending
    assert back.thinned == site.thinned and back.thinner.tau == site.thinner.tau
    for s in (site, back):
        s.tokens = 100
        s.ship(2.0, stopping=True)
    tail = [wire.unpack(b, Tag.FORWARD) for b in site.link.posts[shipped:]]
    again = [wire.unpack(b, Tag.FORWARD) for b in back.link.posts]
    assert np.array_equal(
        np.concatenate([m.keep for m in tail]), np.concatenate([m.keep for m in again])
    )
    assert [m.produced for m in tail] == [m.produced for m in again]
    # the learner: each slot's f with the memory
    meta, arrays = source.save()
    meta = json.loads(json.dumps(meta))
    restored = _memory(cfg, wire, spec)
    restored.restore(meta, {k: np.array(v) for k, v in arrays.items()})
    n = source.held()
    assert n > 0 and restored.held() == n and restored.received == source.received
    assert np.array_equal(restored.keep[:n], source.keep[:n]) and restored.keep_min < 1
    a, b = source.draw(0.5), restored.draw(0.5)
    assert np.array_equal(a.indices, b.indices) and np.allclose(a.weights, b.weights)


def test_forward_carries_keep_and_produced_only_when_thinned():
    cfg = Config(replay_at="thinned")
    _, wire = wire_of(cfg)
    rec = np.zeros(5, wire.record)
    plain = wire.forward(rec, np.ones(5), 3)
    f = keep_value(keep_code(np.array([1.0, 0.5, 0.1, 0.01, 1e-5], np.float32)))
    assert np.allclose(f, [1.0, 0.5, 0.1, 0.01, 1e-5], rtol=0.035)  # codes 6% apart
    assert np.array_equal(keep_value(keep_code(f)), f)  # a code's value is its own code
    kept = wire.forward(rec, np.ones(5), 3, keep=f, produced=20)
    assert kept.nbytes == plain.nbytes + 5  # one byte each
    m = wire.unpack(kept, Tag.FORWARD)
    assert np.array_equal(m.keep, f) and m.produced == 20 and m.n == 5
    p = wire.unpack(plain, Tag.FORWARD)
    assert p.keep is None and p.produced == 5


def test_the_flag_is_a_placement_and_refuses_a_learner_group():
    assert pick("thinned") is thinned and set(PLACEMENTS) == {"buffer", "learner", "thinned"}
    assert "thinned" in build_parser().format_help()
    Config(replay_at="thinned").validate()
    with pytest.raises(ConfigError, match="learners=1"):
        Config(replay_at="thinned", learners=2).validate()
    assert thinned.edge_memory_bytes(Config(), None) == 0
    assert math.isfinite(FLOOR)


@pytest.mark.mpi
def test_a_thinned_run_completes_and_writes_its_files(tmp_path):
    run_dir = tmp_path / "run"
    p = run_mpirl(
        3,
        "--replay-at",
        "thinned",
        "--replay-ratio",
        "0.5",
        "--max-updates",
        "60",
        "--learning-starts",
        "200",
        "--eval-every",
        "30",
        "--target-return",
        "none",
        "--hidden",
        "16",
        "--flush-seconds",
        "1",
        "--progress-seconds",
        "0.2",
        "--run-dir",
        str(run_dir),
        timeout=240,
    )
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    learner, attrs = read_h5(run_dir / "learner.h5")
    assert json.loads(attrs["config_json"])["replay_at"] == "thinned"
    assert len(learner["updates/loss"]) == 60 and np.isfinite(learner["updates/loss"]).all()
    assert (learner["transfers/kind"] == int(Tag.FORWARD)).all()
    buffer, battrs = read_h5(run_dir / "buffer-0.h5")
    assert 0 < battrs["forwarded"] < 0.8 * battrs["inserted"]  # rho 0.5: about half went
    # every received transition is accounted for: forwarded, dropped, or thinned out
    assert battrs["forwarded"] + battrs["forward_dropped"] + battrs["thinned"] == battrs["inserted"]
    assert buffer["site/thinned"][-1] == battrs["thinned"] > 0
    # the exported row keeps the fraction that reached the learner (NaN only for buffer)
    from analysis.export import run_row
    from analysis.runs import load_run

    row = run_row(load_run(run_dir), tmp_path)
    # (the buffer's forwarded over its env steps in the window, both counted where they
    # happen: the learner's own totals read 1.11 for a run this short in CI, its env steps
    # lagging in the 0.25 s step reports)
    assert 0 < row["delivered_fraction"] < 1, row["delivered_fraction"]
    # the draw's kept fraction and the budget it aimed at (rho 0.5 x RHO_SHARE, link unbounded)
    assert 0 < row["thin_kept"] < 1 and row["thin_budget"] == pytest.approx(0.5 * thinned.RHO_SHARE)
    assert np.isnan(buffer["site/thin_budget"]).sum() == 0
    # the clean stop wrote a checkpoint: both sides resume from it (each slot's f, the queue)
    p = run_mpirl(3, "--resume", str(run_dir), "--max-updates", "90", timeout=240)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    learner, _ = read_h5(run_dir / "learner.h5")
    assert len(learner["updates/loss"]) == 90 and np.isfinite(learner["updates/loss"]).all()


def test_the_pilot_on_bytes_prints_what_docs_design_md_quotes():
    """experiments/placement_bytes.py: the bytes rule per produced transition (CartPole)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "experiments" / "placement_bytes.py"
    spec = importlib.util.spec_from_file_location("placement_bytes", path)
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    t = tool.per_transition("CartPole-v1")
    low, high = tool.demand(t, 0.25), tool.demand(t, 4.0)
    assert low["(c) thinned"][0] == pytest.approx(0.25 * (t["F"] + 1))  # a byte of f each
    assert low["(c) thinned"][0] < low["(a) cached"][0] < low["buffer"][0] < low["learner"][0]
    assert high["(c) thinned"][0] == high["learner"][0] == t["F"]  # b = 1: forwarding
    assert high["(a) cached"][0] > 2 * t["F"]  # (a) misses "no more than the cheaper" at rho 4
    cell = tool.cell(t, 1.0, 1.25, 12_000)
    assert "capped" in cell["learner"] and "forwards 23%" in cell["(c) thinned"]
    assert "| 100 Mb/s | 0.25 | 52.2 | 18.2 (+5.2) | 16.4 (+5.2) | 52.2 | 13.3 |" in tool.table(
        "CartPole-v1", 12_000
    )


def test_image_runs_thin_with_the_frames_each_kept_transition_needs():
    """MinAtar: a thinned transition goes with its own frames (the table compacted), and the
    learner samples it with the right ones."""
    images_extra.require()  # skips without the images extra; fails under MPIRL_REQUIRE_IMAGES=1
    cfg = Config(
        env="MinAtar/Breakout-v1",
        replay_at="thinned",
        replay_ratio=0.25,
        replay_capacity=4096,
        forward_chunk=64,
        batch_size=32,
    )
    spec, wire = wire_of(cfg)
    site, _ = _site(cfg, rho=0.25)
    rng = np.random.default_rng(8)
    for k in range(40):  # 64 transitions, 69 frames; frame j of message k holds 100 k + j
        table = np.zeros((69,) + spec.frame_shape, np.uint8)
        table[:] = ((100 * k + np.arange(69)) % 256)[:, None, None, None]
        rec = np.zeros(64, wire.record)
        rec["frames"][:, 0], rec["frames"][:, 1] = np.arange(64), np.arange(64) + 5
        rec["reward"] = (100 * k + np.arange(64)) % 256  # its obs frame's value
        td = rng.lognormal(0, 1, 64).astype(np.float32)
        m = wire.unpack(wire.experience(rec, td, [], 0, 0, frames=table), Tag.EXPERIENCE)
        site.add(m)
    site.tokens = 100
    site.ship(0.0, stopping=True)
    msgs = [wire.unpack(b, Tag.FORWARD) for b in site.link.posts]
    n = sum(m.n for m in msgs)
    assert 0.15 < n / (40 * 64) < 0.35 and all(m.keep is not None for m in msgs)
    assert sum(len(m.frames) for m in msgs) <= 2 * n  # only the frames the kept ones need
    source = _memory(cfg, wire, spec)
    source.limiter.inserted = 10**6  # (insert alone does not count: the learner may sample)
    for m in msgs:
        source.insert(m)
        obs = m.frames[m.records["frames"][:, 0], 0, 0, 0]
        assert np.array_equal(obs, m.records["reward"].astype(np.uint8))
    d = source.draw(1.0)
    assert d is not None and d.frames is not None
    obs = d.frames[d.records["frames"][:, 0], 0, 0, 0]
    assert np.array_equal(obs, d.records["reward"].astype(np.uint8))
    assert np.all(d.weights <= 1.0) and d.weights.min() < 1.0
