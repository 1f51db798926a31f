"""The advisor (mpirl.advise) and ``--replay-at auto`` (mpirl.wiring.resolve_replay_at): the bytes
rule's figures match the committed calibration, the decision follows family U, the nearest
committed cell is named, and a run with ``auto`` records its choice."""

from __future__ import annotations

import csv
import json

import h5py
import pytest
from mpirun import run_mpirl

from mpirl import advise
from mpirl.errors import ConfigError
from mpirl.run.config import Config

CARTPOLE = advise.env_bytes("CartPole-v1", 64)


def _inputs(link_mbps: float, rho: float, production: float = 12_000) -> advise.Inputs:
    return advise.Inputs(link_mbps, 30.0, production, rho * production / 64, 64, CARTPOLE)


def test_cartpole_bytes_match_the_committed_calibration():
    # docs/results.md: 52.2 B per forwarded and 72.8 B per sampled CartPole transition
    assert CARTPOLE.forward == pytest.approx(52.2, rel=0.02)
    assert CARTPOLE.batch == pytest.approx(72.8, rel=0.02)
    assert advise.transition_bytes(48, 64, 256, "").forward == CARTPOLE.forward


def test_a_fast_link_chooses_the_placement_with_fewer_bytes():
    at_quarter = advise.predict(_inputs(100, 0.25))
    assert not any(p.capped for p in at_quarter.values())
    assert advise.decide(at_quarter)[0] == "buffer"  # 1.75 Mb/s of batches against 5 of FORWARD
    assert advise.decide(advise.predict(_inputs(100, 4)))[0] == "learner"


def test_a_thin_link_that_caps_the_buffer_placement_chooses_the_learner():
    pred = advise.predict(_inputs(1.25, 1))
    assert pred["buffer"].capped and pred["buffer"].fraction == pytest.approx(0.179, abs=0.01)
    assert pred["learner"].fraction == pytest.approx(0.25, abs=0.01)
    assert advise.decide(pred)[0] == "learner"
    # only the learner placement capped (cell B's regime): the buffer placement
    assert advise.decide(advise.predict(_inputs(2.5, 0.25)))[0] == "buffer"


def test_the_map_lookup_names_a_committed_cell_and_agrees_with_it():
    cells = advise.load_map()
    assert cells, "docs/results/data/equal-time/runs.csv is committed"
    with advise.MAP_CSV.open(newline="") as f:
        committed = {r["cell"] for r in csv.DictReader(f)}
    a = advise.advise(_inputs(1.25, 1), cells, CARTPOLE)
    ev = a["evidence"]
    assert ev["cell"] == "bandwidth_mbps=1.25, rho=1" and ev["cell"] in committed
    assert ev["favoured"] == "learner" and a["confidence"] == "measured"
    # every committed cell's own rates get the placement its data favour
    for c in cells:
        got = advise.advise(
            advise.Inputs(c.link_mbps, 30, c.production, c.updates_per_s, 64, CARTPOLE),
            cells,
            CARTPOLE,
        )
        assert got["replay_at"] == c.favoured, (c.name, got["sentence"])
    far = advise.advise(_inputs(0.01, 16), cells, CARTPOLE)
    assert far["confidence"] == "extrapolated" and not far["evidence"]["inside_map"]


def test_without_the_committed_map_the_bytes_rule_alone(tmp_path):
    assert advise.load_map(tmp_path / "runs.csv") is None
    a = advise.advise(_inputs(1.25, 1), None)
    assert a["replay_at"] == "learner" and a["confidence"] == "bytes rule only"
    assert "bytes rule alone" in a["sentence"]


def test_the_command_prints_a_table_or_json(capsys):
    argv = ["--link-mbps", "100", "--latency-ms", "30", "--production", "12000"]
    argv += ["--updates-per-s", "46.875", "--env", "CartPole-v1"]
    assert advise.main([*argv, "--json"]) == 0
    a = json.loads(capsys.readouterr().out)
    assert a["replay_at"] == "buffer" and a["inputs"]["rho"] == pytest.approx(0.25)
    assert set(a["predictions"]) == {"learner", "buffer", "thinned"}
    assert a["evidence"]["cell"] == "bandwidth_mbps=100, rho=0.25"
    assert advise.main(argv) == 0
    out = capsys.readouterr().out
    assert "| replay in the buffer (proposed) |" in out and "Use --replay-at buffer" in out
    assert "| thinned at the edge (new; not advised: no evidence yet) |" in out
    assert advise.main(["--link-mbps", "5"]) == 2
    assert "--production" in capsys.readouterr().err


def test_thinned_is_predicted_from_its_budgets_and_never_advised():
    """The thinned placement's row: it forwards b = min(1, rho, 0.95 x capacity / demand) of
    the experiences at the forwarded bytes plus its one-byte f, and the advice never picks it
    (no committed evidence of its learning)."""
    from mpirl.roles.placements.thinned import LINK_SHARE

    per = CARTPOLE.forward + 1
    # a fast link at rho 0.25: the rho-budget, a quarter of the existing placement's bytes
    fast = advise.predict(_inputs(100, 0.25))
    assert fast["thinned"].fraction == pytest.approx(0.25)
    assert fast["thinned"].demand_Bps == pytest.approx(12000 * per * 0.25)
    assert fast["thinned"].demand_Bps < fast["learner"].demand_Bps
    # a thin link at rho 4: the link-budget, never capped
    thin = advise.predict(_inputs(1.25, 4))["thinned"]
    assert thin.link_Bps == pytest.approx(LINK_SHARE * 1.25e6 / 8) and not thin.capped
    assert thin.fraction == pytest.approx(LINK_SHARE * 1.25e6 / 8 / (12000 * per))
    for bw in (0.5, 1.25, 5, 100, 25000):
        for rho in (0.25, 1, 4):
            assert advise.advise(_inputs(bw, rho), None)["replay_at"] != "thinned"


def test_config_takes_auto_and_only_the_three_names():
    Config(replay_at="auto").validate()
    with pytest.raises(ConfigError, match="'auto'"):
        Config(replay_at="cloud").validate()


def _run(tmp_path, *args: str) -> tuple[str, dict]:
    run = tmp_path / "run"
    p = run_mpirl(3, "--replay-at", "auto", "--max-seconds", "8", *args, "--run-dir", str(run))
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    with h5py.File(run / "learner.h5", "r") as f:
        auto = json.loads(f.attrs["replay_at_auto_json"])
        assert json.loads(f.attrs["config_json"])["replay_at"] == auto["replay_at"]
    return p.stdout, auto


@pytest.mark.mpi
def test_auto_on_an_emulated_thin_link_chooses_and_records(tmp_path):
    out, auto = _run(
        tmp_path,
        *("--link", "wan-100m-30ms", "--bandwidth-mbps", "1.25"),
        *("--actor-steps-per-s", "3000", "--learner-updates-per-s", "47"),
    )
    # P = 3,000 (one actor), rho = 47 x 64 / 3,000 = 1: the batches would need 1.75 Mb/s
    assert auto["replay_at"] == "learner" and auto["inputs"]["link_mbps"] == 1.25
    assert out.count("mpirl: --replay-at auto: Use --replay-at learner") == 1
    assert "replay at learner" in out
    got = advise.inputs_from_args(
        advise.build_parser().parse_args(["--run-dir", str(tmp_path / "run")])
    )
    assert got.link_mbps == 1.25 and got.production > 0


@pytest.mark.mpi
def test_auto_on_the_real_link_measures_it(tmp_path):
    out, auto = _run(tmp_path, "--link", "none", "--learner-updates-per-s", "50")
    assert "link measured at start: buffer rank 1:" in out
    assert auto["inputs"]["link_mbps"] > 10  # one host: far faster than any WAN
    assert any("actors unpaced" in n for n in auto["inputs"]["notes"])
