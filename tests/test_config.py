import pytest

from mpirl.config import Config, ConfigError, parse


def test_defaults_valid():
    cfg = parse([])
    assert cfg.env == "CartPole-v1" and cfg.replay_at == "buffer" and cfg.buffers == 1
    cfg.validate(9)


def test_cli_values():
    cfg = parse(["--replay-at", "learner", "--hidden", "32", "32", "--target-return", "none",
                 "--no-dueling", "--max-seconds", "10"])
    assert cfg.replay_at == "learner" and cfg.hidden == (32, 32)
    assert cfg.target_return == float("inf") and cfg.max_seconds == 10.0  # disabled
    assert parse([]).target_return is None  # default: the env's threshold


@pytest.mark.parametrize("argv, match", [
    (["--batch-size", "0"], "batch_size=0 must be an integer > 0"),
    (["--gamma", "1.5"], "gamma=1.5"),
    (["--replay-capacity", "10", "--batch-size", "64"], "batch_size=64 must be <= replay_capacity=10"),
    (["--link", "moon"], "link='moon'"),
    (["--lr", "-1"], "lr=-1.0 must be > 0"),
    (["--hidden", "0"], "hidden=(0,)"),
])
def test_bad_values(argv, match):
    with pytest.raises(ConfigError, match=match.replace("(", r"\(").replace(")", r"\)")):
        parse(argv)


def test_layout_checked_against_world():
    with pytest.raises(ValueError, match="needs >= 5 ranks"):
        Config(buffers=2).validate(4)


def test_toml(tmp_path):
    f = tmp_path / "c.toml"
    f.write_text('replay_at = "learner"\nbatch-size = 32\nhidden = [16]\nlr = 1\n')
    cfg = parse(["--config", str(f), "--batch-size", "16"])
    assert cfg.replay_at == "learner" and cfg.batch_size == 16 and cfg.hidden == (16,)
    assert cfg.lr == 1.0
    f.write_text("bogus = 1\n")
    with pytest.raises(ConfigError, match="unknown key 'bogus'"):
        parse(["--config", str(f)])
    f.write_text('batch_size = "big"\n')
    with pytest.raises(ConfigError, match="batch_size='big' must be an integer"):
        parse(["--config", str(f)])
    with pytest.raises(ConfigError, match="no such file"):
        parse(["--config", str(tmp_path / "missing.toml")])


def test_unknown_option_exits_2(capsys):
    with pytest.raises(SystemExit) as e:
        parse(["--bogus"])
    assert e.value.code == 2
    assert "--bogus" in capsys.readouterr().err
