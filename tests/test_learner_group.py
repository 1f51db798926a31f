"""The learner group's pure parts and its allreduce under real mpirun."""

import json
import subprocess
import sys

import pytest
from mpirun import mpirun_cmd

from mpirl.roles.learner_group import GTag, body, header, pack, parse_straggle
from mpirl.run.config import ConfigError, parse
from mpirl.transport.topology import LayoutError, check_layout, layout


@pytest.mark.mpi
def test_allreduce_equals_one_learner_on_the_concatenated_batches():
    """3 learners (a mean hard-wired to 2 learners shows here, not with 2), 5 updates."""
    p = subprocess.run(
        [*mpirun_cmd(3), sys.executable, "tests/group_allreduce.py", "16", "5"],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["updates"] == 5
    assert out["moved"] > 1e-3  # the updates did something (clip and target copy included)
    assert out["param_diff"] < 1e-5 and out["target_diff"] < 1e-5, out


def test_learners_are_the_first_ranks():
    places = layout(9, 2, learners=3)
    assert [p.role for p in places[:3]] == ["learner"] * 3
    assert [p.index for p in places[:3]] == [0, 1, 2]
    assert places[3].role == "buffer" and places[3].site == 0
    assert sum(p.role == "actor" for p in places) == 4
    with pytest.raises(LayoutError, match="fewer learners"):
        check_layout(4, 1, learners=3)


def test_group_messages_round_trip():
    buf = pack(GTag.GRAD, [b"\x01\x02"], 7, 3, 64, 0.5, 0.25, 1.0)
    h = header(buf)
    assert list(h[:6]) == [GTag.GRAD, 7, 3, 64, 0.5, 0.25] and bytes(body(buf)) == b"\x01\x02"


def test_flags_are_checked():
    cfg = parse(["--learners", "2", "--learner-sync", "allreduce", "--straggle", "1:20"])
    assert cfg.learners == 2 and cfg.learner_sync == "allreduce"
    assert parse_straggle(cfg.straggle) == (1, 20.0)
    assert parse([]).learners == 1 and parse([]).learner_sync == "gba"
    for bad in ("2:20", "x", "1:-3", "1"):
        with pytest.raises(ConfigError, match="straggle="):
            parse(["--learners", "2", "--straggle", bad])
    with pytest.raises(ConfigError, match="learners=0"):
        parse(["--learners", "0"])
    with pytest.raises(LayoutError, match="needs >= 6 ranks"):
        parse(["--learners", "4"]).validate(5)


def test_placement_puts_every_learner_on_the_cloud_host():
    from mpirl import placement as pl

    alloc = pl.allocation_from_nodes("cloud1,node[01-02]", 4, None)
    p = pl.plan(10, 2, alloc, learners=2)
    assert p.lines[0] == ("cloud1", 2) and sum(n for _, n in p.lines) == 10
    hosts = p.hosts()
    assert pl.check_hosts(hosts, 2, learners=2) == []
    assert pl.check_hosts(["cloud1"] * 3 + hosts[3:], 2, learners=2)  # a buffer on the cloud
    assert "2 learners" in pl.render(p)


def test_straggle_sleeps_in_every_update_of_its_rank_only():
    import time

    from mpi4py import MPI

    from mpirl.roles.learner_group import make_sync

    class Trainer:
        steps = 0

        def apply_step(self):
            self.steps += 1

    cfg = parse(["--learners", "2", "--straggle", "0:30"])
    slow = make_sync(cfg, None, 0, None)  # K = 1 view: this rank is learner 0
    t, t0 = Trainer(), time.monotonic()
    for _ in range(3):
        slow.step(t, None, None)
    assert t.steps == 3 and time.monotonic() - t0 >= 0.09
    other = parse(["--learners", "2", "--straggle", "1:30"])
    assert make_sync(other, MPI.COMM_SELF, 0, None).straggle_s == 0.0  # rank 0 of COMM_SELF
