"""mpirl.run.resources: which rank checks what, memory summed per host, and the one message every
rank agrees on, in process (the MPI side is in test_failure.py)."""

from __future__ import annotations

import numpy as np
import pytest

from mpirl.run import resources as R
from mpirl.run.config import Config
from mpirl.transport.topology import layout

GiB = 2**30


@pytest.mark.parametrize(
    "cfg, want",
    [
        (Config(), {"learner": ("env",), "buffer": ("memory",), "actor": ("env",)}),
        (
            Config(replay_at="learner"),
            {"learner": ("env", "memory"), "buffer": (), "actor": ("env",)},
        ),
        (
            Config(tensorboard=True, compress="on"),
            {
                "learner": ("env", "tensorboard", "zstandard"),
                "buffer": ("memory", "tensorboard", "zstandard"),
                "actor": ("env",),
            },
        ),
        # compress=auto compresses image runs only (told from the id, before any import)
        (
            Config(env="MinAtar/Breakout-v1"),
            {"learner": ("env", "zstandard"), "buffer": ("memory", "zstandard"), "actor": ("env",)},
        ),
        (
            Config(env="MinAtar/Breakout-v1", compress="off"),
            {"learner": ("env",), "buffer": ("memory",), "actor": ("env",)},
        ),
    ],
)
def test_each_role_checks_only_what_it_uses(cfg, want):
    assert {role: R.checks_for(role, cfg) for role in want} == want


def rows_for(places, hosts: dict[int, str], avail: dict[int, int]) -> np.ndarray:
    rows = np.zeros(len(places), R.ROW)
    for p in places:
        rows[p.rank]["host"] = hosts.get(p.rank, "cloud").encode()
        rows[p.rank]["avail"] = avail.get(p.rank, -1)
    return rows


def test_two_buffers_on_one_host_are_checked_together():
    """Each memory fits the host alone, both do not: one failure naming both buffers."""
    places = layout(7, 2)  # learner, buffer 0 (rank 1) + 2 actors, buffer 1 (rank 4) + 2 actors
    assert [p.rank for p in places if p.role == "buffer"] == [1, 4]
    cfg, need = Config(buffers=2, replay_capacity=1000), 1 * GiB
    edge = {r: "edge" for r in range(1, 7)}
    # both buffers read about 1.5 GiB (a little apart: the smallest reading counts); the actors
    # read nothing (they hold no memory, and do not look)
    rows = rows_for(places, edge, {1: int(1.5 * GiB), 4: int(1.25 * GiB)})
    (f,) = R.memory_failures(rows, places, cfg, need)
    assert (f.ranks, f.host, f.check) == ((1, 4), "edge", "memory")
    assert "2 x 1.00 GiB = 2.00 GiB" in f.text and "only 1.25 GiB" in f.text
    assert "at most 500" in f.text  # 80% of 1.25 GiB over 2 memories of 1 GiB / 1000
    msg = R.verdict(rows, places, cfg, need)
    assert msg.startswith(
        "rank 1 (buffer of site 0) and rank 4 (buffer of site 1) on host "
        "edge: memory: 2 replay memories"
    ), msg
    # on two hosts each fits
    apart = {**edge, 4: "edge-2", 5: "edge-2", 6: "edge-2"}
    rows = rows_for(places, apart, {1: int(1.5 * GiB), 4: int(1.4 * GiB)})
    assert R.memory_failures(rows, places, cfg, need) == []
    assert R.verdict(rows, places, cfg, need) == ""


def test_memory_is_checked_where_the_replay_memory_lives():
    places = layout(3, 1)
    small = {0: GiB // 2, 1: GiB // 2}  # both would fail if they were checked
    at_buffer = R.memory_failures(rows_for(places, {}, small), places, Config(), GiB)
    assert [f.ranks for f in at_buffer] == [(1,)]
    at_learner = R.memory_failures(
        rows_for(places, {}, small), places, Config(replay_at="learner"), GiB
    )
    assert [f.ranks for f in at_learner] == [(0,)]
    # an unknown reading (-1) is not checked
    assert R.memory_failures(rows_for(places, {}, {}), places, Config(), GiB) == []


def test_one_rank_failing_is_named_a_failure_everywhere_is_said_as_is():
    places, cfg = layout(4, 1), Config()
    rows = rows_for(places, {2: "edge", 3: "edge"}, {1: 10 * GiB})
    rows[3]["check"], rows[3]["error"] = b"env", b"env='X' cannot import module 'x'"
    assert R.verdict(rows, places, cfg, 1) == (
        "rank 3 (actor of site 0) on host edge: env: env='X' cannot import module 'x'"
    )
    # the same on every rank that builds envs (learner, actors): a bad --env, said once as is
    for r in (0, 2):
        rows[r]["check"], rows[r]["error"] = rows[3]["check"], rows[3]["error"]
    assert R.verdict(rows, places, cfg, 1) == "env='X' cannot import module 'x'"
    # and the others' failures follow, by name
    rows[1]["check"], rows[1]["error"] = b"zstandard", b"needs zstandard"
    assert R.verdict(rows, places, cfg, 1) == (
        "env='X' cannot import module 'x'; also failing: rank 1 (buffer of site 0) on host "
        "cloud: zstandard"
    )


def test_an_actor_whose_env_differs_from_the_learners_is_refused():
    from mpirl.agent import envs

    places, cfg = layout(3, 1), Config()
    spec = envs.inspect("CartPole-v1")
    rows = rows_for(places, {2: "edge"}, {})
    rows[0]["spec"] = R.spec_json(spec).encode()
    rows[2]["spec"] = R.spec_json(envs.EnvSpec((8,), np.dtype("f4"), 2, None)).encode()
    msg = R.verdict(rows, places, cfg, 1)
    assert msg.startswith("rank 2 (actor of site 0) on host edge: env: env='CartPole-v1' gives ")
    assert "install the same env and versions on every host" in msg
    assert R.spec_from_json(R.spec_json(spec)) == spec


def test_image_specs_travel_whole():
    """Buffers take rank 0's spec from its row: frame shape, stack and scale included."""
    for module in ("minatar", "ale_py", "cv2"):
        pytest.importorskip(module)
    from mpirl.agent import envs

    for env_id in ("MinAtar/Breakout-v1", "ALE/Pong-v5"):
        spec = envs.inspect(env_id)
        text = R.spec_json(spec)
        assert len(text.encode()) < R.ROW["spec"].itemsize // 2
        assert R.spec_from_json(text) == spec


def test_local_checks_and_the_test_hook():
    from mpirl.run.failure import forced_checks
    from mpirl.run.resources import CHECKS

    cfg = Config(tensorboard=True, compress="on")
    row, spec = R.local_row(cfg, "actor", "h", frozenset({"memory", "tensorboard"}))
    assert spec is not None and not row["check"] and row["avail"] == -1  # not an actor's checks
    assert R.spec_from_json(R._text(row["spec"])) == spec
    row, spec = R.local_row(cfg, "buffer", "h", frozenset({"memory"}))
    assert spec is None and row["avail"] == 0 and not row["spec"]  # a buffer builds no env
    row, _ = R.local_row(cfg, "buffer", "h", frozenset({"zstandard"}))
    assert row["check"] == b"zstandard" and "MPIRL_FAULT_CHECK" in R._text(row["error"])
    row, _ = R.local_row(cfg, "learner", "h", frozenset({"env"}))
    assert row["check"] == b"env" and row["host"] == b"h"
    assert forced_checks(2, CHECKS, "1:memory,2:env, 2:zstandard") == {"env", "zstandard"}
    assert forced_checks(0, CHECKS, "") == frozenset()
    with pytest.raises(ValueError, match="RANK:CHECK"):
        forced_checks(0, CHECKS, "1:disk")


class OneRankWorld:
    """``check`` seen from one rank of a ``size``-rank world: Allgather puts this rank's row in
    its slot and ``other`` (a passing row) in every other slot."""

    def __init__(self, rank: int, size: int, other: np.ndarray):
        self.rank, self.size, self.other = rank, size, other

    def Get_rank(self):
        return self.rank

    def Get_size(self):
        return self.size

    def Allgather(self, send, recv):
        rows = recv[0].view(R.ROW)
        rows[:] = self.other
        rows[self.rank] = send[0].view(R.ROW)[0]


def test_host_checks_follow_the_learner_group_layout(monkeypatch):
    """With --learners 2 on 5 ranks, rank 1 is a learner and rank 2 the buffer: each runs its
    own role's checks and is named by it (the layout without K took rank 1 for the buffer and
    rank 2 for an actor, whose memory check was skipped)."""
    from mpirl.run.config import ConfigError

    cfg = Config(learners=2)
    other, _ = R.local_row(cfg, "learner", "cloud", frozenset())  # rank 0, with the env spec
    monkeypatch.setenv("MPIRL_FAULT_CHECK", "2:memory")
    with pytest.raises(ConfigError, match=r"rank 2 \(buffer of site 0\) on host .*: memory"):
        R.check(OneRankWorld(2, 5, other), cfg)
    monkeypatch.setenv("MPIRL_FAULT_CHECK", "1:env")
    with pytest.raises(ConfigError, match=r"rank 1 \(learner\) on host .*: env"):
        R.check(OneRankWorld(1, 5, other), cfg)
