"""experiments/link_bytes.py: the bytes per transition a sweep's bandwidth is calibrated with."""

import importlib.util
from pathlib import Path

import pytest

from mpirl.agent.envs import inspect
from mpirl.replay.build import record_dtype
from mpirl.run.config import Config

ROOT = Path(__file__).resolve().parent.parent


def _tool():
    spec = importlib.util.spec_from_file_location("link_bytes", ROOT / "experiments/link_bytes.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_cartpole_bytes_per_transition_are_the_record_plus_per_message_fields():
    r = _tool().measure("CartPole-v1", 600)
    cfg = Config()
    rec = record_dtype(cfg, inspect(cfg.env)).itemsize  # 48 B: obs, next_obs, action, ...
    assert r["transitions"] >= 600 - 64 - 3 * 4 and not r["compress"]  # full chunks sent
    # FORWARD: the record and its |td| (4 B), plus one 40-byte header per 256 transitions
    assert r["forward_B"] == pytest.approx(rec + 4 + 40 / 256, abs=0.5)
    # BATCH: + index (8), generation (8), weight (4), priority (4) per sampled transition
    assert r["batch_B"] == pytest.approx(rec + 24 + 48 / 64, abs=1.0)
    assert r["forward_B"] == r["forward_raw_B"] and r["batch_B"] == r["batch_raw_B"]


def test_bad_input_is_one_clear_error(capsys):
    tool = _tool()
    assert tool.main(["--env", "Nope-v0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("link_bytes: env='Nope-v0'") and "Traceback" not in err
    with pytest.raises(SystemExit) as e:
        tool.main(["--steps", "10"])
    assert e.value.code == 2 and "--steps 10 is too few" in capsys.readouterr().err
