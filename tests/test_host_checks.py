"""Checks that can differ by host go through the one gathered verdict (mpirl.run.resources),
printed once by rank 0, naming the rank, its host and the fix; what the configuration says is the
same on every rank (``--config`` is read by rank 0 and sent to every rank)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from mpirun import mpirun_cmd, one_error, run_mpirl

from mpirl.run import resources
from mpirl.run.config import Config, ConfigError
from mpirl.transport import topology

ROOT = Path(__file__).resolve().parent.parent


def _no_zstandard(monkeypatch):
    """As on a host without zstandard: importing it fails, find_spec finds nothing."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setitem(sys.modules, "zstandard", None)
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "zstandard" else real(name, *a),
    )


def _verdict(cfg: Config, n: int, forced: dict[int, set] | None = None, host=lambda r: "h") -> str:
    places = topology.layout(n, cfg.buffers, cfg.learners)
    rows = np.stack(
        [
            resources.local_row(
                cfg, p.role, host(p.rank), frozenset((forced or {}).get(p.rank, ()))
            )[0]
            for p in places
        ]
    )
    try:
        resources.decide(rows, places, cfg)
    except ConfigError as e:
        return str(e)
    return ""


def test_delta_weights_check_zstandard_on_the_hosts_that_use_it(monkeypatch):
    """--weights-encoding delta: not a check of validate (which every rank runs alone, and a
    rank that fails it exits while rank 0 waits in the host check's Allgather), but a host
    check of the learner and the buffers (the actors get float32 from their buffer)."""
    _no_zstandard(monkeypatch)
    cfg = Config(weights_encoding="delta")
    cfg.validate(3)  # no import here
    assert "zstandard" in resources.checks_for("learner", cfg)
    assert "zstandard" in resources.checks_for("buffer", cfg)
    assert "zstandard" not in resources.checks_for("actor", cfg)
    err = _verdict(cfg, 3, host=lambda r: f"edge-{r}")
    assert "weights_encoding='delta'" in err and "zstandard" in err, err
    assert "--weights-encoding bf16" in err and "\n" not in err


def test_delta_weights_name_the_one_host_without_zstandard():
    cfg = Config(weights_encoding="delta")
    err = _verdict(cfg, 4, forced={1: {"zstandard"}}, host=lambda r: f"edge-{r}")
    assert err.startswith("rank 1 (buffer of site 0) on host edge-1: zstandard:"), err
    assert "weights_encoding='delta'" in err


def test_device_is_checked_on_every_learner_of_the_group(monkeypatch):
    """--device cuda with --learners 2: learner 1 resolves its own device on its own host; a
    host where it cannot is named (before, rank 0 checked for all of them)."""
    from mpirl.agent import device

    monkeypatch.setattr(device, "check", lambda dev, amp: "")  # the hosts have a GPU...
    cfg = Config(device="cuda", learners=2)
    assert "device" in resources.checks_for("learner", cfg)
    assert "device" not in resources.checks_for("buffer", cfg)
    assert "device" not in resources.checks_for("learner", Config())  # auto: no torch import
    assert _verdict(cfg, 5) == ""
    err = _verdict(cfg, 5, forced={1: {"device"}}, host=lambda r: f"cloud-{r}")  # ...but one
    assert err.startswith("rank 1 (learner) on host cloud-1: device:"), err
    assert "--device cpu" in err


def test_device_failing_alike_is_said_once_as_is(monkeypatch):
    from mpirl.agent import device

    monkeypatch.setattr(device, "check", lambda dev, amp: f"device={dev!r}: no GPU here")
    assert _verdict(Config(device="cuda", learners=2), 5) == "device='cuda': no GPU here"


@pytest.mark.mpi
def test_delta_without_zstandard_on_one_host_is_one_error_under_mpirun(tmp_path):
    p = run_mpirl(
        3,
        "--weights-encoding", "delta", "--max-seconds", "5",
        "--run-dir", str(tmp_path / "run"),
        env={"MPIRL_FAULT_CHECK": "1:zstandard"},
        timeout=120,
    )  # fmt: skip
    err = one_error(p)
    assert "rank 1 (buffer of site 0) on host" in err and "weights_encoding='delta'" in err, err
    assert not (tmp_path / "run").exists()


@pytest.mark.mpi
def test_config_file_is_read_by_rank_0_and_sent_to_every_rank(tmp_path):
    """The TOML file exists only in rank 0's working folder (as on the learner's host alone):
    every rank runs the configuration it holds.  Before, the other ranks could not read it,
    exited 2 in silence, and rank 0 waited for them in the host check."""
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    (a / "run.toml").write_text('max_seconds = 3\ntarget_return = "none"\ncheckpoint_seconds = 0\n')
    run = tmp_path / "run"
    prog = [sys.executable, "-m", "mpirl.main", "--config", "run.toml", "--run-dir", str(run)]
    n = mpirun_cmd(1)
    cmd = [*n[:-2], "-n", "1", "-wdir", str(a), *prog, ":", "-n", "2", "-wdir", str(b), *prog]
    import os

    env = dict(os.environ, PYTHONPATH=str(ROOT))
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env)  # (it hung)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    import json

    summary = json.loads((run / "summary.json").read_text())
    assert summary["stop_reason"] == "max_seconds"
    from mpirun import read_h5

    _, attrs = read_h5(run / "buffer-0.h5")
    cfg = json.loads(attrs["config_json"])
    assert cfg["max_seconds"] == 3 and cfg["config"] == "run.toml"


@pytest.mark.mpi
def test_config_file_missing_on_rank_0_is_one_error(tmp_path):
    p = run_mpirl(3, "--config", str(tmp_path / "nope.toml"), timeout=60)
    assert "no such file" in one_error(p)


@pytest.mark.mpi
def test_bad_toml_is_named_as_given(tmp_path):
    (tmp_path / "bad.toml").write_text("max_seconds = = 3\n")
    (tmp_path / "unknown.toml").write_text("colour = 3\n")
    err = one_error(run_mpirl(3, "--config", str(tmp_path / "bad.toml"), timeout=60))
    assert f"config={str(tmp_path / 'bad.toml')!r} is not valid TOML" in err, err
    err = one_error(run_mpirl(3, "--config", str(tmp_path / "unknown.toml"), timeout=60))
    assert f"config={str(tmp_path / 'unknown.toml')!r}: unknown key 'colour'" in err, err
