"""The pipeline under real mpirun: experiences, priorities and weights move; every rank exits 0."""

import json

import numpy as np
import pytest
from mpirun import read_h5 as read
from mpirun import run_mpirl

# a budget of updates, not of seconds: the run does the work the assertions need (an evaluation
# every 100 updates, weight broadcasts at least every 100) and stops
UPDATES = 200
SHORT = [
    "--max-updates",
    str(UPDATES),
    "--eval-every",
    "100",
    "--progress-seconds",
    "2",
    "--target-return",
    "none",
    "--learning-starts",
    "200",
    "--flush-seconds",
    "1",
    "--hidden",
    "32",
    "32",
]
pytestmark = pytest.mark.mpi


@pytest.mark.parametrize(
    "n, buffers, replay_at",
    [
        (3, 1, "buffer"),
        (3, 1, "learner"),
        (5, 1, "buffer"),
        (5, 2, "learner"),
        (5, 2, "buffer"),
    ],
)
def test_pipeline_moves_everything(tmp_path, n, buffers, replay_at):
    run_dir = tmp_path / "run"
    p = run_mpirl(
        n,
        "--replay-at",
        replay_at,
        "--buffers",
        str(buffers),
        "--run-dir",
        str(run_dir),
        *SHORT,
        timeout=240,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    assert "stopping (max_updates)" in p.stdout
    assert p.stdout.count("stopping") == 1  # one rank speaks
    files = sorted(x.name for x in run_dir.glob("*.h5"))
    n_actors = n - 1 - buffers
    assert len(files) == n and "learner.h5" in files
    assert sum(f.startswith("buffer-") for f in files) == buffers
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["stop_reason"] == "max_updates" and summary["updates"] == UPDATES

    learner, attrs = read(run_dir / "learner.h5")
    assert json.loads(attrs["config_json"])["replay_at"] == replay_at
    layout = json.loads(attrs["layout_json"])
    assert [x["role"] for x in layout].count("actor") == n_actors
    assert "MPI" in json.loads(attrs["versions_json"])["mpi_library"]
    assert len(learner["updates/loss"]) == summary["updates"]
    assert np.isfinite(learner["updates/loss"]).all()
    xfer_kind = 5 if replay_at == "buffer" else 4
    assert (learner["transfers/kind"] == xfer_kind).all() and len(learner["transfers/n"]) > 0
    assert (learner["transfers/priority_mean"] > 0).all()
    assert set(learner["transfers/buffer"]) == set(range(buffers))  # every site was served
    assert learner["link/bytes_in"].sum() > 0 and learner["link/bytes_out"].sum() > 0
    assert len(learner["evals/ret_mean"]) >= 1

    for b in range(buffers):
        buf, battrs = read(run_dir / f"buffer-{b}.h5")
        assert battrs["env_steps"] > 0 and battrs["inserted"] > 0
        assert battrs["link_bytes_out"] > 0
        if replay_at == "buffer":
            assert battrs["sampled"] > 0 and buf["site/replay_size"].max() > 0
            assert len(buf["batches/batch"]) > 0
            # every priority update the learner sent (one per batch it trained on) reached the
            # buffer and was applied or counted as dropped, and the applied ones changed the
            # memory's priorities (what gets sampled)
            sent = learner["transfers/n"][learner["transfers/buffer"] == b].sum()
            site = {
                k: buf[f"site/{k}"][-1]
                for k in (
                    "prio_received",
                    "prio_applied",
                    "stale_dropped",
                    "too_stale",
                    "prio_moved",
                )
            }
            assert site["prio_received"] == sent > 0, site
            assert (
                site["prio_applied"] + site["stale_dropped"] + site["too_stale"]
                == site["prio_received"]
            ), site
            assert site["prio_applied"] > 0 and site["prio_moved"] > 0, site
        else:
            assert battrs["sampled"] == 0
    steps = 0
    cfg = json.loads(attrs["config_json"])
    m, n_envs = cfg["envs_per_actor"], n_actors * cfg["envs_per_actor"]
    # Ape-X exploration over ALL envs of ALL actors: eps_i = base^(1 + alpha * i / (N - 1)),
    # i = 0..N-1, actor k holding envs k*m .. k*m+m-1 (computed here, not with mpirl's function)
    apex = [cfg["eps_base"] ** (1 + cfg["eps_alpha"] * i / (n_envs - 1)) for i in range(n_envs)]
    blocks = []
    for f in run_dir.glob("actor-*.h5"):
        act, aattrs = read(f)
        eps = list(aattrs["epsilons"])
        k = min(range(n_actors), key=lambda k: abs(apex[k * m] - eps[0]))
        np.testing.assert_allclose(eps, apex[k * m : (k + 1) * m], rtol=1e-12)
        blocks.append(k)
        # every episode was logged with its env's rate
        np.testing.assert_allclose(
            act["episodes/epsilon"], np.float32(eps)[act["episodes/env"]], rtol=1e-6
        )
        assert act["actor/weights_version"].max() >= 1  # weights were refreshed, not only the first
        assert act["actor/msgs_sent"].max() > 0
        # start-up ends at the first env step: after the file was opened, before its last row
        assert (
            aattrs["t0_unix"] < aattrs["first_step_unix"] < aattrs["t0_unix"] + act["actor/t"][-1]
        )
        steps += aattrs["env_steps"]
    # everything the actors produced was counted by the buffers and reached the learner's stats
    assert steps == summary["env_steps"]
    assert sorted(blocks) == list(range(n_actors))  # each block of the schedule exactly once


def test_site_weights_share_the_learner(tmp_path):
    """Two sites (one actor each), weights 3:1, replay at the buffers: the learner trains ~3x
    more of site 0."""
    run_dir = tmp_path / "run"
    p = run_mpirl(
        5,
        "--buffers",
        "2",
        "--site-weights",
        "3",
        "1",
        "--run-dir",
        str(run_dir),
        *SHORT,
        "--replay-ratio",
        "0",
        timeout=240,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    learner, _ = read(run_dir / "learner.h5")
    sites = learner["transfers/buffer"]
    share = (sites == 0).sum() / max(1, (sites == 1).sum())
    assert 2.0 < share < 4.5, share
