import pytest

from mpirl.run.config import Config, ConfigError, parse


def test_defaults_valid():
    cfg = parse([])
    assert cfg.env == "CartPole-v1" and cfg.replay_at == "buffer" and cfg.buffers == 1
    cfg.validate(9)


def test_cli_values():
    cfg = parse(
        [
            "--replay-at",
            "learner",
            "--hidden",
            "32",
            "32",
            "--target-return",
            "none",
            "--no-dueling",
            "--max-seconds",
            "10",
        ]
    )
    assert cfg.replay_at == "learner" and cfg.hidden == (32, 32)
    assert cfg.target_return == float("inf") and cfg.max_seconds == 10.0  # disabled
    assert parse([]).target_return is None  # default: the env's threshold


@pytest.mark.parametrize(
    "argv, match",
    [
        (["--batch-size", "0"], "batch_size=0 must be an integer > 0"),
        (["--gamma", "1.5"], "gamma=1.5"),
        (
            ["--replay-capacity", "10", "--batch-size", "64"],
            "batch_size=64 must be <= replay_capacity=10",
        ),
        (["--link", "moon"], "link='moon'"),
        (["--lr", "-1"], "lr=-1.0 must be > 0"),
        (["--hidden", "0"], "hidden=(0,)"),
        (["--arrival-sample", "-1"], "arrival_sample=-1 must be an integer >= 0"),
        (["--reference-size", "0"], "reference_size=0 must be an integer > 0"),
        (
            ["--severe-staleness", "5", "--max-grad-staleness", "4"],
            "severe_staleness=5 must be below max_grad_staleness=4",
        ),
    ],
)
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


def test_env_kwargs_and_wrappers_from_cli_toml_and_stored(tmp_path):
    """--env-kwargs is JSON on the command line, a table in TOML; --env-wrappers a comma list or
    a TOML list; both survive the stored config (--resume, mpirl.play)."""
    from mpirl.run.config import to_dict

    cli = parse(["--env-kwargs", '{"n": 3, "length": 7}', "--env-wrappers", "a.b:f, c:g"])
    assert cli.env_kwargs == {"n": 3, "length": 7} and cli.wrapper_specs() == ["a.b:f", "c:g"]
    toml = tmp_path / "run.toml"
    toml.write_text('env-wrappers = ["a.b:f", "c:g"]\n[env_kwargs]\nn = 3\nlength = 7\n')
    from_toml = parse(["--config", str(toml)])
    assert from_toml.env_kwargs == cli.env_kwargs
    assert from_toml.wrapper_specs() == cli.wrapper_specs()
    assert parse(["--config", str(toml), "--env-kwargs", "{}"]).env_kwargs == {}  # flags win
    import json

    stored = json.loads(json.dumps(to_dict(cli)))  # as config_json / the manifest hold it
    again = parse(["--resume", "RUN"], stored=stored)
    assert again.env_kwargs == cli.env_kwargs and again.env_wrappers == cli.env_wrappers
    assert parse([]).env_kwargs is None and parse([]).wrapper_specs() == []


@pytest.mark.parametrize(
    "argv, match",
    [
        (["--env-kwargs", "{n: 3}"], "env_kwargs='{n: 3}' is not valid JSON"),
        (["--env-kwargs", "[3]"], "must be a JSON object"),
        (["--env-wrappers", "no_colon"], "'no_colon' must be 'module:function'"),
    ],
)
def test_bad_env_options(argv, match):
    with pytest.raises(ConfigError, match=match.replace("[", r"\[")):
        parse(argv)


def test_weights_flags(tmp_path):
    """--weights-every is N or auto (a TOML number too); a bad value, share or encoding is one
    ConfigError naming it."""
    from mpirl.run.config import parse

    assert parse([]).weights_every_fixed() is None  # auto by default
    assert parse(["--weights-every", "25"]).weights_every_fixed() == 25
    toml = tmp_path / "run.toml"
    toml.write_text("weights_every = 50\n")
    assert parse(["--config", str(toml)]).weights_every_fixed() == 50
    for argv, match in [
        (["--weights-every", "0"], "weights_every='0'"),
        (["--weights-every", "often"], "weights_every='often'"),
        (["--weights-link-share", "1.5"], "weights_link_share=1.5"),
        (["--weights-keyframe-every", "0"], "weights_keyframe_every=0"),
        (["--weights-piece-ms", "-1"], "weights_piece_ms=-1.0"),
    ]:
        with pytest.raises(ConfigError, match=match):
            parse(argv)
