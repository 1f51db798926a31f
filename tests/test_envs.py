"""Environment families and the error a missing images extra gives (no extra needed)."""

import pytest

from mpirl.agent import envs
from mpirl.run.config import ConfigError


def test_missing_extra_names_the_pip_command(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "ale_py" else real(name, *a)
    )
    with pytest.raises(ConfigError, match=r'pip install -e "\.\[images\]"') as e:
        envs.inspect("ALE/Pong-v5")
    assert "ale-py" in str(e.value)


def test_family_from_id():
    assert envs.family("ALE/Pong-v5") == "atari"
    assert envs.family("BreakoutNoFrameskip-v4") == "atari"
    assert envs.family("MinAtar/Breakout-v1") == "minatar"
    assert envs.family("CartPole-v1") == "vector"
