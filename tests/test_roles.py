"""The roles' steps on their own, without mpirun: the consistent cut's bookkeeping, the forward
queue, and a buffer handling PRIORITIES and EXPERIENCE messages (a one-rank communicator and a
scripted link stand in for the site and the learner)."""

import numpy as np
import pytest

from mpirl.fakes import make_buffer, wire_of
from mpirl.logs.runlog import RunLog
from mpirl.roles.placements.at_learner import ForwardQueue
from mpirl.run.config import Config
from mpirl.transport.cut import Cut, SiteCut
from mpirl.transport.wire import Tag


class _Checkpointer:
    def next_id(self):
        return 7


def test_cut_holds_a_site_from_its_ack_and_completes_with_the_last():
    cut = Cut(_Checkpointer(), [1, 2], every_s=10.0, timeout_s=5.0, t_start=0.0)
    assert not cut.due(9.9, stopping=False) and cut.due(10.0, stopping=False)
    assert not cut.due(10.0, stopping=True)  # a stop waits for no new checkpoint
    assert cut.begin(10.0) == 7 and cut.in_progress and not cut.due(30.0, stopping=False)
    assert not cut.acknowledge(1, 6, 100)  # an ack of another checkpoint is not ours
    assert cut.acknowledge(1, 7, 100) and cut.holds(1) and not cut.holds(2)
    cut.park(1, ["late-1", "late-2"])
    assert not cut.complete and cut.overdue(14.0) is None
    assert "buffer(s) [1]" in cut.overdue(15.5)  # site rank 2 is buffer 1
    assert cut.acknowledge(2, 7, 50) and cut.complete
    cut.end(16.0)
    assert not cut.holds(1) and cut.unpark(1) == ["late-1", "late-2"] and cut.unpark(1) == []
    assert cut.final_id() == 8  # the next id: STOP carries it
    assert Cut(None, [1], every_s=10.0, timeout_s=5.0, t_start=0.0).final_id() == -1


def test_site_cut_completes_when_every_actor_acknowledged():
    cut = SiteCut([1, 2, 3])
    assert not cut.acknowledge(1, 0)  # nothing in progress
    cut.begin(4)
    for a in (1, 3):
        assert cut.acknowledge(a, 4)
    assert cut.holds(3) and not cut.holds(2) and not cut.complete
    assert cut.acknowledge(2, 4) and cut.complete
    cut.end()
    assert not cut.in_progress and not cut.held


def test_forward_queue_drops_the_oldest_and_splits_groups_when_taking():
    cfg = Config(replay_at="learner")
    spec, wire = wire_of(cfg)
    q = ForwardQueue(wire, spec, limit=10, drop_oldest=True)
    for k in range(2):
        rec = np.zeros(4, wire.record)
        rec["action"] = k
        q.add(rec, np.full(4, float(k), np.float32))
    assert q.len == 8 and q.dropped == 0 and not q.full
    rec = np.zeros(4, wire.record)
    rec["action"] = 2
    q.add(rec, np.full(4, 2.0, np.float32))  # 12 > 10: the oldest group goes
    assert q.len == 8 and q.dropped == 4
    records, td, table = q.take(6)  # a group split: its tail stays at the front
    assert table is None and records["action"].tolist() == [1] * 4 + [2] * 2
    assert td.tolist() == [1.0] * 4 + [2.0] * 2 and q.len == 2 and not q.full
    state = q.state()
    back = ForwardQueue(wire, spec, limit=10, drop_oldest=True)
    back.restore(state)
    assert back.len == 2 and back.take(5)[0]["action"].tolist() == [2, 2]


@pytest.fixture
def site_buffer(tmp_path):
    """A Buffer with its replay memory (replay_at=buffer) on a one-rank site (no actors)."""
    cfg = Config(replay_at="buffer", hidden=(16,), replay_capacity=64, max_staleness=4)
    spec, wire = wire_of(cfg)
    with RunLog(tmp_path / "buffer-0.h5", {}, flush_seconds=1) as log:
        buf = make_buffer(cfg, spec, wire, log)
        buf.owed[1] = 0  # the experiences below come from "actor 1" (the site has none)
        yield buf, wire


def _experience(wire, n, env_steps):
    return wire.unpack(
        wire.experience(np.zeros(n, wire.record), np.ones(n, np.float32), [1.0], env_steps, 0),
        Tag.EXPERIENCE,
        rank=1,
    )


def test_buffer_applies_priorities_only_to_slots_not_overwritten(site_buffer):
    buf, wire = site_buffer
    side = buf.side
    buf.on_experience(_experience(wire, 64, 64))
    got = (side.limiter.inserted, buf.env_steps, buf.episodes, len(side.memory))
    assert got == (64, 64, 1, 64)
    s = side.memory.sample(16)
    side.batch_id = 1  # batch 0 was sent
    buf.on_experience(_experience(wire, 32, 32))  # overwrites slots 0..31
    raw = wire.priorities(s.indices, s.generations, np.full(16, 5.0), 0, 0.0, updates=10)
    side.on_priorities(wire.unpack(raw, Tag.PRIORITIES, t=1.0))
    stale = int((s.indices < 32).sum())
    assert 0 < stale < 16  # both cases in the batch (fixed seed)
    assert side.prio_received == 16 and side.stale_dropped == stale
    assert side.prio_applied == 16 - stale and side.learner_updates == 10
    assert (side.prio_moved > 0) == (stale < 16)


def test_buffer_drops_priorities_older_than_max_staleness(site_buffer):
    buf, wire = site_buffer
    side = buf.side
    buf.on_experience(_experience(wire, 64, 64))
    s = side.memory.sample(8)
    side.batch_id = 10  # batches 0..9 sent; batch 0 is 9 behind, max_staleness 4
    before = side.memory.total_priority()
    raw = wire.priorities(s.indices, s.generations, np.full(8, 9.0), 0, 0.0)
    side.on_priorities(wire.unpack(raw, Tag.PRIORITIES, t=1.0))
    assert side.too_stale == 8 and side.prio_applied == 0
    assert side.memory.total_priority() == before


def test_stats_say_which_weights_each_actor_acts_with(site_buffer):
    """The policy lag is measured from the weights each actor acts with (EXPERIENCE.acting),
    not from the buffer's cache, which after a resume says 0 until a keyframe arrives."""
    buf, wire = site_buffer
    m = wire.experience(np.zeros(4, wire.record), np.ones(4, np.float32), [], 4, 0, acting=40)
    buf.on_experience(wire.unpack(m, Tag.EXPERIENCE, rank=1))
    stats = wire.unpack(buf.stats(), Tag.STATS)
    actors, acting = stats.acting
    assert actors.tolist() == [1] and acting.tolist() == [40]
    assert stats.weights_updates == 0  # the buffer's cache holds no weights yet


def test_every_shard_of_the_learner_group_weighs_on_one_scale():
    """Memory at the learner, K learners: each samples its own shard, whose importance weights
    are divided by its own max weight; the lead puts every shard's batch on the scale of the
    largest max weight (as it does for the sites' batches), its own and the other learners'
    (through ORDER's scale, from the max weight each GRAD reports)."""
    from mpirl.replay.build import make_replay
    from mpirl.roles.placements.at_learner import LocalMemory
    from mpirl.roles.placements.common import Drawn

    cfg = Config(
        replay_at="learner", hidden=(16,), replay_capacity=256, batch_size=8, replay_ratio=0
    )
    spec, wire = wire_of(cfg)
    memory = make_replay(cfg, spec, wire.record, seed=0)
    rng = np.random.default_rng(0)
    memory.add(np.zeros(64, wire.record), rng.random(64).astype(np.float32) * 5)
    source = LocalMemory(cfg, memory, {}, wire, None, None, lambda: 0, lambda m: False, 1)
    own = source.draw(0.4)
    assert own is not None and own.scale == 1.0  # alone, its own scale
    mine = memory.max_weight()
    source.trained(Drawn(None, member=1, max_weight=4 * mine), np.zeros(8), 0.0, 0)
    d = source.draw(0.4)  # another shard's max weight is 4x: this shard's weigh a quarter
    assert d is not None and d.scale == pytest.approx(memory.max_weight() / (4 * mine))
    order = source.for_member(1, 64)  # the other shard's own weights are on the top scale
    assert order is not None and order.member == 1 and order.scale == 1.0
    g = wire.unpack(wire.grad(3, 0, np.ones(8, np.float32), 0.5, 0.1, None, 2.5), Tag.GRAD)
    assert g.max_weight == 2.5
